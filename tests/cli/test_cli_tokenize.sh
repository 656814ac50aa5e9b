#!/usr/bin/env bash
# test_cli_tokenize.sh - drives `ckv tokenize`: ids and --decode on a small handmade byte-level
# tokenizer.json, stdin input, chat wrapping, and every bad input (flags, missing or unsupported
# tokenizer files, invalid UTF-8, bad ids) ending with exit status 1 or 2 and ONE line on stderr
# that names the problem, never a crash. With the real tokenizers present (tools/models/
# fetch_tokenizers.sh) it also round-trips text through Llama 3.2, Qwen2.5 and Mistral v3.
# usage: test_cli_tokenize.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2; tmp=$(mktemp -d "$3/clitok.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
root=$(cd "$fx/../.." && pwd)
real=${CKV_TOKENIZERS_DIR:-$root/models/tokenizers}

if "$ckv" tokenize --help 2>&1 | grep -q "unknown command"; then
  echo "SKIP: this ckv binary has no 'tokenize' command yet"; exit 77
fi

. "$(dirname "$0")/../common/expect.sh" # expect_error

expect_out() {
  local name=$1 want=$2; shift 2
  local got; got=$("$@" 2>"$tmp/err")
  local rc=$?
  if [ "$rc" -ne 0 ] || [ "$got" != "$want" ]; then
    echo "FAIL $name: exit $rc, got '$got', expected '$want'"; cat "$tmp/err"; fail=1
  else
    echo "ok   $name: $got"
  fi
}

# --- a handmade byte-level tokenizer: h e l o Ġ w r d ... with merges up to "hello", "Ġworld" ---
tok=$tmp/tok
mkdir -p "$tok"
cat >"$tok/tokenizer.json" <<'EOF'
{"added_tokens":[{"id":20,"content":"<|end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
 {"id":23,"content":"<bos>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
 "normalizer":null,
 "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
 "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<bos>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
   "pair":[],"special_tokens":{"<bos>":{"id":"<bos>","ids":[23],"tokens":["<bos>"]}}},
 "decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
 "model":{"type":"BPE","dropout":null,"unk_token":null,"fuse_unk":false,"byte_fallback":false,
   "vocab":{"h":0,"e":1,"l":2,"o":3,"\u0120":4,"w":5,"r":6,"d":7,"he":8,"ll":9,"hell":10,"hello":11,"\u0120w":12,
            "or":13,"\u0120wor":14,"\u0120world":15,"ld":16,"\u00c3":17,"\u00a9":18,"!":19},
   "merges":["h e","l l","he ll","hell o","\u0120 w","o r","\u0120w or","l d","\u0120wor ld"]}}
EOF
cat >"$tok/tokenizer_config.json" <<'EOF'
{"bos_token":"<bos>","chat_template":"{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}{% endfor %}"}
EOF

expect_out "ids with special tokens" "23 11 15 19" "$ckv" tokenize --model "$tok" --text "hello world!"
expect_out "ids without" "11 15 19" "$ckv" tokenize --model "$tok/tokenizer.json" --no-special --text "hello world!"
expect_out "special-token text" "11 20" "$ckv" tokenize --model "$tok" --no-special --text "hello<|end|>"
expect_out "stdin" "11 15" bash -c "printf 'hello world' | '$ckv' tokenize --model '$tok' --no-special"
expect_out "count" "4" "$ckv" tokenize --model "$tok" --count --text "hello world!"
expect_out "decode" "<bos>hello world!" "$ckv" tokenize --model "$tok" --decode --text "23, 11, 15, 19"
expect_out "decode skip special" "hello world!" "$ckv" tokenize --model "$tok" --decode --skip-special --text "23 11 15 19"
expect_out "decode split UTF-8" "é" "$ckv" tokenize --model "$tok" --decode --text "17 18"
expect_out "invalid UTF-8 replaced" "11" bash -c "printf 'hello\\xff' | '$ckv' tokenize --model '$tok' --no-special --utf8-replace"

expect_error "no model" "--model is required" "$ckv" tokenize --text hi
expect_error "unknown flag" "unknown flag '--bogus'" "$ckv" tokenize --model "$tok" --bogus
expect_error "missing dir" "$tmp/nowhere" "$ckv" tokenize --model "$tmp/nowhere" --text hi
expect_error "empty dir" "tokenizer.json" "$ckv" tokenize --model "$tmp" --text hi
printf '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}' >"$tmp/unigram.json"
expect_error "unsupported model" "model type 'Unigram' is not supported" "$ckv" tokenize --model "$tmp/unigram.json" --text hi
printf '{"pre_tokenizer":{"type":"Whitespace"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}' >"$tmp/ws.json"
expect_error "unsupported pre-tokenizer" "pre_tokenizer type 'Whitespace' is not supported" \
  "$ckv" tokenize --model "$tmp/ws.json" --text hi
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}' >"$tmp/badmerge.json"
expect_error "bad merge" "merge 0: token 'b' is not in the vocabulary" "$ckv" tokenize --model "$tmp/badmerge.json" --text hi
printf '{"model": ' >"$tmp/trunc.json"
expect_error "truncated JSON" "invalid JSON" "$ckv" tokenize --model "$tmp/trunc.json" --text hi
expect_error "invalid UTF-8" "not valid UTF-8: byte 0xff at offset 5" bash -c "printf 'hello\\xff' | '$ckv' tokenize --model '$tok'"
expect_error "bad id text" "not a non-negative token id" "$ckv" tokenize --model "$tok" --decode --text "1 x 2"
expect_error "id out of range" "token id 99999" "$ckv" tokenize --model "$tok" --decode --text "1 99999"
expect_error "unknown template" "'vicuna' is unknown" "$ckv" tokenize --model "$tok" --chat --template vicuna --text hi
expect_error "template without chat" "--template needs --chat" "$ckv" tokenize --model "$tok" --template chatml --text hi
printf 'GGUF\x09\x00\x00\x00' >"$tmp/model.gguf"
expect_error "corrupt gguf" "model.gguf" "$ckv" tokenize --model "$tmp/model.gguf" --text hi

# --- the real tokenizers, when fetched ---
if [ -f "$real/llama3.2/tokenizer.json" ]; then
  text=$'Hello, world! Ünïcödé 日本語 🚀\n\tcode: x = [1, 2, 3]'
  for name in llama3.2 qwen2.5 mistral-v3; do
    [ -f "$real/$name/tokenizer.json" ] || continue
    ids=$("$ckv" tokenize --model "$real/$name" --no-special --text "$text") || { echo "FAIL $name encode"; fail=1; continue; }
    back=$("$ckv" tokenize --model "$real/$name" --decode --text "$ids"; printf x)
    if [ "${back%x}" != "$text" ]; then echo "FAIL $name round trip: '${back%x}'"; fail=1
    else echo "ok   $name round trip ($(wc -w <<<"$ids") tokens)"; fi
  done
  first=$("$ckv" tokenize --model "$real/qwen2.5" --chat --template qwen2.5 --text "Hi" | cut -d' ' -f1)
  [ "$first" = 151644 ] && echo "ok   qwen2.5 chat starts with <|im_start|>" || { echo "FAIL qwen2.5 chat: first id $first"; fail=1; }
  first=$("$ckv" tokenize --model "$real/llama3.2" --chat --template llama3.1 --text "Hi" | cut -d' ' -f1-2)
  [ "$first" = "128000 128006" ] && echo "ok   llama3.2 chat header" || { echo "FAIL llama3.2 chat: $first"; fail=1; }
else
  echo "note: real tokenizers not present under $real (tools/models/fetch_tokenizers.sh); round trips skipped"
fi

exit $fail
