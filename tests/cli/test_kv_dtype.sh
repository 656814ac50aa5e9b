#!/usr/bin/env bash
# test_kv_dtype.sh - `ckv generate --kv-dtype f32|f16|bf16` on every fixture model: the KV cache in
# half precision gives the same greedy ids as the f32 reference cache on these prompts (the fixtures'
# margins between the top two logits are far above the rounding of keys and values), the stats say
# how many bytes the cache holds (half of f32's), and dtypes a backend cannot hold are refused with
# one line.
# usage: test_kv_dtype.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/kvdt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
for model in llama_gqa mistral_gqa qwen2_bias; do
  dir=$fx/$model
  ids=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(','.join(map(str,r['prompt_ids'][:64])))" "$dir/reference.json")
  for dt in f32 f16 bf16; do
    if ! "$ckv" generate --model "$dir" --prompt-ids "$ids" --max-new-tokens 12 --ignore-eos --kv-dtype "$dt" \
        --stats-json "$tmp/$model.$dt.json" >"$tmp/$model.$dt.out" 2>"$tmp/err"; then
      echo "FAIL $model --kv-dtype $dt: $(cat "$tmp/err")"; fail=1; continue
    fi
  done
  for dt in f16 bf16; do
    if cmp -s "$tmp/$model.f32.out" "$tmp/$model.$dt.out"; then
      echo "ok   $model --kv-dtype $dt: greedy ids equal the f32 cache's ($(tr '\n' ' ' <"$tmp/$model.$dt.out"))"
    else
      echo "FAIL $model --kv-dtype $dt: ids $(cat "$tmp/$model.$dt.out") differ from f32's $(cat "$tmp/$model.f32.out")"; fail=1
    fi
  done
done
# half-precision caches hold half the bytes of f32 (keys and values; positions stay int32)
python3 - "$tmp/llama_gqa.f32.json" "$tmp/llama_gqa.bf16.json" <<'PY' || fail=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
key = next((k for k in ("kv_bytes_peak", "kv_bytes_used", "kv_bytes") if k in a), None)
if key is None:
    print("FAIL stats: no KV byte figure in", sorted(a)); sys.exit(1)
r = b[key] / a[key]
ok = 0.45 < r < 0.65
print(("ok  " if ok else "FAIL"), f" bf16 cache holds {r:.3f} of the f32 cache's {key} ({b[key]} vs {a[key]} bytes)")
sys.exit(0 if ok else 1)
PY
"$ckv" generate --model "$fx/llama_gqa" --prompt-ids 1,2,3 --max-new-tokens 2 --kv-dtype q8 >/dev/null 2>"$tmp/err"
rc=$?
if [ "$rc" -ge 1 ] && [ "$rc" -lt 128 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ]; then echo "ok   --kv-dtype q8 refused: $(cat "$tmp/err")"
else echo "FAIL --kv-dtype q8: exit $rc, stderr: $(cat "$tmp/err")"; fail=1; fi
exit $fail
