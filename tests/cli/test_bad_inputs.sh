#!/usr/bin/env bash
# test_bad_inputs.sh - the bad-input corpus of issue 13, run against the ckv binary: corrupt copies of
# the fixture model M (tests/fixtures/models/llama_gqa) and of a cache file saved from it, hostile
# config.json / tokenizer.json / JSONL files, targets that are not regular files, endless inputs
# (/dev/zero) and names with control bytes. Every case must end, within its time limit, with an exit
# status between 1 and 127 and exactly one printable line on stderr containing the expected text.
# The GGUF case needs the SmolLM2 GGUF that tools/models/fetch_smollm2.sh puts in models/ (skipped,
# saying so, when it is absent).
# usage: test_bad_inputs.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2; tmp=$(mktemp -d "$3/bad.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
M=$fx/models/llama_gqa
P=$(seq -s, 1 200)
unset CKV_MAX_INPUT_BYTES
export ckv M P tmp

# expect_error (tests/common/expect.sh); informational lines such as "ckv: press ..." may precede the
# error line here, and CMD may be one of the exported shell functions below (gen, ev, lc, sc).
EXPECT_ERROR_LOGS=1
. "$(dirname "$0")/../common/expect.sh" # expect_error

copy_model() { rm -rf "$tmp/$1"; cp -r "$M" "$tmp/$1"; }
gen() { "$ckv" generate --model "$1" --prompt-ids "$P" --max-new-tokens 2 --threads 1 "${@:2}"; }
ev() { "$ckv" eval --model "$M" --threads 1 --progress none --out "$tmp/evout.$RANDOM" "$@"; }
lc() { "$ckv" generate --model "$M" --load-cache "$1" --question-ids 5,6 --max-new-tokens 2 --threads 1; }
sc() { gen "$M" --question-ids 5 --press snapkv --budget 0.5 --save-cache "$1"; }
export -f gen ev lc sc

# python3 helpers: patch a safetensors header or data, rewrite a cache file with its checksum fixed
cat >"$tmp/patch.py" <<'PY'
import json, struct, sys

def st_load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])

def fnv(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h

def cache_parse(b):
    """-> (meta, [(layer, head, len_offset, n)], d)"""
    ml = struct.unpack("<I", b[12:16])[0]
    meta = b[16:16 + ml]
    nl, nkv, d = struct.unpack("<III", b[16 + ml:28 + ml])
    off, heads = 28 + ml, []
    for l in range(nl):
        for h in range(nkv):
            n = struct.unpack("<I", b[off:off + 4])[0]
            heads.append((l, h, off, n))
            off += 4 + n * (4 + 8 * d)
    return meta, heads, d

cmd, path = sys.argv[1], sys.argv[2]
if cmd == "st_hlen":  # header length + delta
    b, n, _ = st_load(path)
    open(path, "wb").write(struct.pack("<Q", n + int(sys.argv[3])) + b[8:])
elif cmd == "st_value":  # write a bit pattern at the start of a tensor
    b, n, h = st_load(path)
    t = h[sys.argv[3]]
    bits = {"F32": {"nan": b"\x00\x00\xc0\x7f", "inf": b"\x00\x00\x80\x7f"},
            "BF16": {"nan": b"\xc0\x7f", "inf": b"\x80\x7f"},
            "F16": {"nan": b"\x00\x7e", "inf": b"\x00\x7c"}}[t["dtype"]][sys.argv[4]]
    at = 8 + n + t["data_offsets"][0] + 8 * len(bits)
    open(path, "wb").write(b[:at] + bits + b[at + len(bits):])
elif cmd == "st_dtype":  # set a tensor's dtype string (JSON-decoded argument), header re-padded
    b, n, h = st_load(path)
    h[sys.argv[3]]["dtype"] = json.loads(sys.argv[4])
    hb = json.dumps(h).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
elif cmd == "cache":  # cache PATH WHAT: corrupt one thing, then fix the checksum
    b = bytearray(open(path, "rb").read())
    meta, heads, d = cache_parse(b)
    l, h, off, n = next(x for x in heads if x[3] >= 3)
    what = sys.argv[3]
    if what == "nan_key":
        b[off + 4 + 4 * n + 4 * 2:off + 4 + 4 * n + 4 * 3] = b"\x00\x00\xc0\x7f"
    elif what == "huge_len":
        b[off:off + 4] = struct.pack("<I", 0x7FFFFFFF)
    elif what == "neg_pos":
        b[off + 4:off + 8] = struct.pack("<i", -5)
    elif what == "unsorted":
        b[off + 8:off + 12] = b[off + 4:off + 8]
    elif what.startswith("context_len="):
        m = json.loads(meta)
        m["context_len"] = json.loads(what.split("=", 1)[1])
        mb = json.dumps(m).encode()
        b = b[:12] + struct.pack("<I", len(mb)) + mb + b[16 + len(meta):]
    if what != "nofix":
        b[-8:] = struct.pack("<Q", fnv(bytes(b[:-8])))
    else:
        b[off:off + 4] = struct.pack("<I", 0x7FFFFFFF)
    open(path, "wb").write(bytes(b))
elif cmd == "gguf_nan":  # NaN into the first element of the first F32 tensor's data
    b = bytearray(open(path, "rb").read())
    o = 4
    ver, nt, nkv = struct.unpack("<IQQ", b[o:o + 20]); o += 20
    def rd(fmt):
        global o
        v = struct.unpack_from("<" + fmt, b, o); o += struct.calcsize("<" + fmt); return v[0]
    def string():
        global o
        n = rd("Q"); s = bytes(b[o:o + n]); o += n; return s
    size = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    align = 32
    def value(t):
        if t == 8: return string()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [value(et) for _ in range(n)]
        return rd(size[t])
    for _ in range(nkv):
        k = string(); t = rd("I"); v = value(t)
        if k == b"general.alignment": align = v
    infos = []
    for _ in range(nt):
        name = string(); nd = rd("I"); dims = [rd("Q") for _ in range(nd)]; t = rd("I"); off = rd("Q")
        infos.append((name, t, off))
    data = (o + align - 1) // align * align
    name, t, off = next(x for x in infos if x[1] == 0 and x[0].startswith(b"blk."))
    b[data + off:data + off + 4] = b"\x00\x00\xc0\x7f"
    open(path, "wb").write(bytes(b))
    print(name.decode())
PY
patch() { python3 "$tmp/patch.py" "$@"; }

# ---- weights (item 2, 5) ----
copy_model hlen_m1; patch st_hlen "$tmp/hlen_m1/model.safetensors" -1
expect_error "safetensors header length - 1" "wrong header length or data_offsets" gen "$tmp/hlen_m1"
copy_model hlen_p1; patch st_hlen "$tmp/hlen_p1/model.safetensors" 1
expect_error "safetensors header length + 1" "model.safetensors" gen "$tmp/hlen_p1"
copy_model nan_w; patch st_value "$tmp/nan_w/model.safetensors" model.layers.1.mlp.down_proj.weight nan
expect_error "NaN weight (F32)" "tensor 'model.layers.1.mlp.down_proj.weight': element 8 of the slice read is NaN" gen "$tmp/nan_w"
rm -rf "$tmp/inf_w"; cp -r "$fx/models/llama_gqa_bf16" "$tmp/inf_w"
patch st_value "$tmp/inf_w/model.safetensors" model.norm.weight inf
expect_error "infinite weight (BF16)" "tensor 'model.norm.weight': element 8 of the slice read is infinite" gen "$tmp/inf_w"
gguf="$fx/../../models/smollm2-135m-instruct-q4_1.gguf"
if [ -f "$gguf" ]; then
  cp "$gguf" "$tmp/bad.gguf"
  t=$(patch gguf_nan "$tmp/bad.gguf")
  expect_error "GGUF weight byte flipped to NaN" "tensor '$t': element 0 of the slice read is NaN" \
    "$ckv" generate --model "$tmp/bad.gguf" --prompt-ids 1,2,3 --max-new-tokens 2 --threads 1
  rm -f "$tmp/bad.gguf"
else
  echo "skip GGUF weight byte flipped to NaN: $gguf absent (tools/models/fetch_smollm2.sh fetches it)"
fi

# ---- names with control bytes are escaped (item 6) ----
copy_model evil_dtype; patch st_dtype "$tmp/evil_dtype/model.safetensors" model.norm.weight '"F3\u001b[2J\n2"'
expect_error "dtype with an escape sequence" "unknown dtype 'F3\\x1b[2J\\x0a2'" gen "$tmp/evil_dtype"
copy_model evil_arch
python3 - "$tmp/evil_arch/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["architectures"] = ["Llama\u001b]0;owned\u0007\nForCausalLM\u0085"]
json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "architecture with control bytes" "architectures[0] 'Llama\\x1b]0;owned\\x07\\x0aForCausalLM\\xc2\\x85'" gen "$tmp/evil_arch"

# ---- config.json and tokenizer (item 5) ----
cfg_case() { # NAME WANT PYTHON-EXPR-ON-TEXT
  copy_model "cfg_$1"
  python3 -c "import sys; p=sys.argv[1]; t=open(p).read(); open(p,'w').write($3)" "$tmp/cfg_$1/config.json"
  expect_error "config.json: $1" "$2" gen "$tmp/cfg_$1"
}
cfg_case trailing_garbage "config.json: unexpected bytes after the JSON value" "t + ' }garbage'"
cfg_case duplicate_key "config.json: duplicate key 'vocab_size' in one object" "t.replace('{', '{\"vocab_size\": 100000,', 1)"
cfg_case rms_eps_1e300 "rms_norm_eps 1e+300 is outside [1e-12, 0.1]" "t.replace('1e-05', '1e300')"
cfg_case eos_outside "eos_token_id 512 is outside the vocabulary of 512 tokens" "t.replace('\"eos_token_id\": 2', '\"eos_token_id\": [2, 512]')"
cfg_case bos_outside "bos_token_id 9999 is outside the vocabulary" "t.replace('\"bos_token_id\": 1', '\"bos_token_id\": 9999')"
copy_model emptyvocab
python3 - "$tmp/emptyvocab/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])); t["model"]["vocab"] = {}; t["model"]["merges"] = []
json.dump(t, open(sys.argv[1], "w"))
PY
expect_error "empty tokenizer vocabulary" "model.vocab is empty" "$ckv" tokenize --model "$tmp/emptyvocab" --text "hello"

# ---- JSONL datasets (item 5) ----
printf '{"context": "ab\\u0000cd", "question": "q", "answers": ["a"], "task": "qa", "metric": "qa_f1"}\n' >"$tmp/nul_esc.jsonl"
expect_error "JSONL \\u0000 in a string" "nul_esc.jsonl:1: string with a \\u0000 (NUL) character" ev --data "$tmp/nul_esc.jsonl"
printf '{"context": "ab\0cd", "question": "q", "answers": ["a"], "task": "qa", "metric": "qa_f1"}\n' >"$tmp/nul_raw.jsonl"
expect_error "JSONL raw NUL" "nul_raw.jsonl:1: NUL byte at byte 16 of the line" ev --data "$tmp/nul_raw.jsonl"
printf '{"context": "c", "question": "q", "questions": ["q1"], "answers": [["a"]], "task": "qa", "metric": "qa_f1"}\n' >"$tmp/both.jsonl"
expect_error "JSONL question and questions" "both.jsonl:1: both \"questions\" and \"question\" are given" ev --data "$tmp/both.jsonl"

# ---- cache files (items 2, 4) ----
if gen "$M" --question-ids 5,6 --press snapkv --budget 0.5 --save-cache "$tmp/ctx.ckv" >/dev/null 2>"$tmp/err"; then
  for what in nan_key huge_len neg_pos unsorted nofix; do cp "$tmp/ctx.ckv" "$tmp/$what.ckv"; patch cache "$tmp/$what.ckv" $what; done
  expect_error "cache: NaN key" "non-finite key" lc "$tmp/nan_key.ckv"
  start=$(date +%s)
  expect_error "cache: huge head length, checksum fixed" "holds 2147483647 rows, more than the 200-token context" lc "$tmp/huge_len.ckv"
  expect_error "cache: huge head length, checksum stale" "holds 2147483647 rows, more than the 200-token context" lc "$tmp/nofix.ckv"
  el=$(( $(date +%s) - start ))
  if [ "$el" -gt 20 ]; then echo "FAIL cache size checks took $el s (allocation before validation?)"; fail=1; fi
  expect_error "cache: negative position" "position -5 is outside the context" lc "$tmp/neg_pos.ckv"
  expect_error "cache: unsorted positions" "breaks the ascending order" lc "$tmp/unsorted.ckv"
  cp "$tmp/ctx.ckv" "$tmp/ctx100.ckv"; patch cache "$tmp/ctx100.ckv" context_len=100
  expect_error "cache: context_len disagrees with the rows" "is outside the context" lc "$tmp/ctx100.ckv"
  cp "$tmp/ctx.ckv" "$tmp/ctx1e300.ckv"; patch cache "$tmp/ctx1e300.ckv" context_len=1e300
  expect_error "cache: context_len 1e300" "ctx1e300.ckv" lc "$tmp/ctx1e300.ckv"
  head -c 3000 "$tmp/ctx.ckv" >"$tmp/short.ckv"
  expect_error "cache: truncated" "truncated cache file" lc "$tmp/short.ckv"
  expect_error "cache: /dev/zero" "not a regular file" lc /dev/zero
else
  echo "FAIL saving the cache the corrupt copies start from:"; cat "$tmp/err"; fail=1
fi

# ---- --save-cache targets (item 3) ----
expect_error "--save-cache /dev/full" "/dev/full is a character device; ckv writes only regular files" sc /dev/full
if [ ! -c /dev/full ]; then echo "FAIL /dev/full is no longer a character device"; fail=1; fi
touch "$tmp/target.ckv"; ln -s "$tmp/target.ckv" "$tmp/link.ckv"
expect_error "--save-cache to a symbolic link" "link.ckv is a symbolic link" sc "$tmp/link.ckv"
if [ ! -L "$tmp/link.ckv" ] || [ -s "$tmp/target.ckv" ]; then echo "FAIL the symbolic link or its target changed"; fail=1; fi
mkdir "$tmp/adir"
expect_error "--save-cache to a directory" "adir is a directory" sc "$tmp/adir"
if ls "$tmp" | grep -q '\.tmp'; then echo "FAIL temporary files left: $(ls "$tmp" | grep '\.tmp')"; fail=1; fi

# ---- endless inputs (item 8): a small limit, then the default one ----
export CKV_MAX_INPUT_BYTES=4M
lim="input larger than the limit of 4194304 bytes"
expect_error "--data /dev/zero" "/dev/zero: $lim" ev --data /dev/zero
expect_error "--prompt-file /dev/zero" "/dev/zero: $lim" "$ckv" generate --model "$M" --prompt-file /dev/zero --max-new-tokens 1
expect_error "--text-file /dev/zero" "/dev/zero: $lim" "$ckv" fidelity --model "$M" --text-file /dev/zero --press snapkv --budget 0.5
expect_error "--haystack /dev/zero" "/dev/zero: $lim" ev --task niah_single_1 --length 256 --samples 1 --haystack /dev/zero
expect_error "kvzip prompt id past the vocabulary" "press kvzip: repeat_ids id 9999 is outside the vocabulary of 512" \
  gen "$M" --question-ids 5 --press kvzip --budget 0.5 --press-opt repeat_ids=13,9999 --press-opt repeat_next_ids=13 \
  --press-opt suffix_ids=13
expect_error "--profile /dev/zero" "/dev/zero: $lim" gen "$M" --press headkv:snapkv --budget 0.5 --profile /dev/zero
# finch: its window is the question, compressed with the context (query-aware)
expect_error "finch without --query-aware" "press finch scores with the question's attention: it needs a question compressed with the context (query_aware)" \
  gen "$M" --question-ids 5,6 --press finch --budget 0.5
expect_error "finch chunk_length too short for the question" "press finch: chunk_length 3 must exceed question / (1 - cr) = 2 / (1 - 0.5)" \
  gen "$M" --question-ids 5,6 --query-aware --press finch --budget 0.5 --press-opt chunk_length=3
expect_error "finch in eval" "--press finch: its window is the question's tokens, which eval does not know" \
  ev --task niah_single_1 --length 256 --samples 1 --press finch --budget 0.5 --query-aware
expect_error "chunkkv chunk_length 0" "press chunkkv: chunk_length 0 must be at least 1" \
  gen "$M" --question-ids 5 --press chunkkv:snapkv --budget 0.5 --press-opt chunk_length=0
export CKV_MAX_INPUT_BYTES=2x
expect_error "CKV_MAX_INPUT_BYTES unparsable" "CKV_MAX_INPUT_BYTES='2x' is not a positive byte count" ev --data /dev/zero
unset CKV_MAX_INPUT_BYTES
expect_error "--data /dev/zero, default limit" "/dev/zero: input larger than the limit of 268435456 bytes" ev --data /dev/zero

exit $fail
