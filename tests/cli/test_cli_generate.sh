#!/usr/bin/env bash
# test_cli_generate.sh - drives `ckv generate` and `ckv inspect` on the fixture models: greedy ids
# equal the transformers reference, and every bad input (flags, files, configs, checkpoints) ends
# with exit status 1 or 2 and ONE line on stderr that names what is wrong — never a crash.
# usage: test_cli_generate.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
llama=$fx/llama_gqa

# expect_error NAME EXPECTED_SUBSTRING CMD...: non-zero exit below 128, one stderr line containing the text
expect_error() {
  local name=$1 want=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
    echo "FAIL $name: exit status $rc (expected 1 or 2)"; cat "$tmp/err"; fail=1
  elif [ "$lines" -ne 1 ]; then
    echo "FAIL $name: $lines lines on stderr, expected one:"; cat "$tmp/err"; fail=1
  elif ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL $name: stderr lacks '$want':"; cat "$tmp/err"; fail=1
  else
    echo "ok   $name: $(cat "$tmp/err")"
  fi
}

# --- a good run: greedy ids equal the reference ---
ids=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(','.join(map(str,r['prompt_ids'])))" "$llama/reference.json")
want=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(' '.join(map(str,r['greedy_ids'])))" "$llama/reference.json")
got=$("$ckv" generate --model "$llama" --prompt-ids "$ids" --max-new-tokens 9 --ignore-eos --threads 2 --chunk 50 \
      --stats-json "$tmp/stats.json" 2>"$tmp/err")
if [ "$got" != "$want" ]; then echo "FAIL greedy ids: got '$got', expected '$want'"; cat "$tmp/err"; fail=1
else echo "ok   greedy ids match the reference: $got"; fi
python3 - "$tmp/stats.json" <<'PY' || fail=1
import json, sys
s = json.load(open(sys.argv[1]))
assert s["prefill_tokens"] == 240 and s["decode_tokens"] == 8, s
assert s["prefill_tok_s"] > 0 and s["decode_tok_s"] > 0 and s["peak_rss_bytes"] > 0 and s["kv_bytes"] > 0, s
print("ok   stats json:", s)
PY
"$ckv" inspect --model "$llama" --tp 2 --context 1000 >"$tmp/inspect" 2>&1 || { echo "FAIL inspect"; cat "$tmp/inspect"; fail=1; }
grep -q "LlamaForCausalLM" "$tmp/inspect" && grep -q "KV cache" "$tmp/inspect" || { echo "FAIL inspect output"; cat "$tmp/inspect"; fail=1; }

# --- flags ---
expect_error "no command" "no command given" "$ckv"
expect_error "unknown command" "unknown command 'fly'" "$ckv" fly
expect_error "missing --model" "--model is required" "$ckv" generate --prompt-ids 1,2
expect_error "unknown flag" "unknown flag '--bogus'" "$ckv" generate --model "$llama" --prompt-ids 1 --bogus
expect_error "flag without value" "--max-new-tokens needs a value" "$ckv" generate --model "$llama" --prompt-ids 1 --max-new-tokens
expect_error "bad integer" "--threads: expected an integer, got 'two'" "$ckv" generate --model "$llama" --prompt-ids 1 --threads two
expect_error "zero threads" "--threads: 0 is outside" "$ckv" generate --model "$llama" --prompt-ids 1 --threads 0
expect_error "negative new tokens" "--max-new-tokens: -1 is outside" "$ckv" generate --model "$llama" --prompt-ids 1 --max-new-tokens -1
expect_error "top-p zero" "--top-p" "$ckv" generate --model "$llama" --prompt-ids 1 --top-p 0
expect_error "top-p above one" "--top-p" "$ckv" generate --model "$llama" --prompt-ids 1 --top-p 1.5
expect_error "temperature nan" "--temperature" "$ckv" generate --model "$llama" --prompt-ids 1 --temperature nan
expect_error "chunk zero" "--chunk" "$ckv" generate --model "$llama" --prompt-ids 1 --chunk 0
expect_error "bad prompt ids" "'x' at token 1" "$ckv" generate --model "$llama" --prompt-ids 1,x,3
expect_error "empty prompt" "no token ids" "$ckv" generate --model "$llama" --prompt-ids ","
expect_error "both prompt flags" "exactly one of" "$ckv" generate --model "$llama" --prompt-ids 1 --prompt-ids-file x
expect_error "missing prompt file" "nope.txt" "$ckv" generate --model "$llama" --prompt-ids-file "$tmp/nope.txt"
expect_error "token outside vocabulary" "outside the vocabulary" "$ckv" generate --model "$llama" --prompt-ids 1,99999
expect_error "unknown backend" "unknown backend 'tpu'" "$ckv" generate --model "$llama" --prompt-ids 1 --backend tpu
long=$(python3 -c "print(','.join(['5']*1100))")
echo "$long" >"$tmp/long.txt"
expect_error "prompt too long" "max_position_embeddings" "$ckv" generate --model "$llama" --prompt-ids-file "$tmp/long.txt"
expect_error "prompt + new too long" "--max-new-tokens 100" "$ckv" generate --model "$llama" --prompt-ids-file <(python3 -c "print(','.join(['5']*1000))") --max-new-tokens 100

# --- model directories ---
expect_error "missing model dir" "config.json" "$ckv" generate --model "$tmp/none" --prompt-ids 1
mk() { rm -rf "$tmp/m"; cp -r "$llama" "$tmp/m"; }
mk; python3 - "$tmp/m/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c["architectures"] = ["GPT2LMHeadModel"]; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "unknown architecture" "GPT2LMHeadModel" "$ckv" generate --model "$tmp/m" --prompt-ids 1
expect_error "inspect unknown architecture" "GPT2LMHeadModel" "$ckv" inspect --model "$tmp/m"
mk; echo '{"architectures": ["LlamaForCausalLM"], "hidden_size": ' >"$tmp/m/config.json"
expect_error "truncated config" "config.json" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; python3 - "$tmp/m/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c["intermediate_size"] += 8; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "shape disagrees with config" "mlp.gate_proj.weight" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; truncate -s 5000 "$tmp/m/model.safetensors"
expect_error "truncated checkpoint" "model.safetensors" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; rm "$tmp/m/model.safetensors"
expect_error "missing checkpoint" "model.safetensors" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; python3 - "$tmp/m/model.safetensors" <<'PY'
# drop one tensor from the header (rewrite the file without it)
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
del h["model.layers.1.self_attn.v_proj.weight"]
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
expect_error "missing tensor" "model.layers.1.self_attn.v_proj.weight" "$ckv" generate --model "$tmp/m" --prompt-ids 1

exit $fail
