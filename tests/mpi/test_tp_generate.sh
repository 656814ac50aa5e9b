#!/usr/bin/env bash
# test_tp_generate.sh - tensor parallelism is exact: for every fp32 fixture model, `ckv generate` on
# 2 and 4 MPI ranks (one host, --oversubscribe; 4 ranks on a model with 2 or 1 KV heads exercises
# replica groups) produces the same greedy ids as 1 rank and logits within 1e-4; a rank count that
# does not divide the heads fails with a clear message and a non-zero exit, without hanging.
# usage: test_tp_generate.sh CKV_BINARY FIXTURES_DIR TMP_DIR MPIRUN
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/tp.XXXXXX"); mpirun=$4
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { timeout 120 "$mpirun" --oversubscribe -np "$@"; }
fail=0

compare() { # compare LOGITS_A LOGITS_B NAME
  python3 - "$1" "$2" "$3" <<'PY'
import struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
if len(a) != len(b) or not a:
    print(f"FAIL {sys.argv[3]}: logits sizes {len(a)} vs {len(b)}"); sys.exit(1)
n = len(a) // 4
x = struct.unpack(f"<{n}f", a); y = struct.unpack(f"<{n}f", b)
err = max(abs(p - q) for p, q in zip(x, y))
print(f"{'ok  ' if err <= 1e-4 else 'FAIL'} {sys.argv[3]}: {n} logits, max |diff| {err:.3g} (tolerance 1e-4)")
sys.exit(0 if err <= 1e-4 else 1)
PY
}

for model in llama_gqa mistral_gqa qwen2_bias; do
  dir=$fx/$model
  ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$dir/reference.json")
  "$ckv" generate --model "$dir" --prompt-ids "$ids" --max-new-tokens 12 --ignore-eos --threads 1 --chunk 64 \
    --dump-logits "$tmp/$model.1.f32" >"$tmp/$model.1.ids" 2>"$tmp/err" || { echo "FAIL $model 1 rank"; cat "$tmp/err"; fail=1; continue; }
  heads=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_attention_heads'])" "$dir/config.json")
  for np in 2 4; do
    if (( heads % np )); then
      mpi "$np" "$ckv" generate --model "$dir" --prompt-ids "$ids" --max-new-tokens 4 --threads 1 >/dev/null 2>"$tmp/err"
      rc=$?
      if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "does not divide the model's $heads attention heads" "$tmp/err"; then
        echo "ok   $model on $np ranks refused: $(grep -m1 'does not divide' "$tmp/err")"
      else
        echo "FAIL $model on $np ranks: exit $rc"; cat "$tmp/err"; fail=1
      fi
      continue
    fi
    mpi "$np" "$ckv" generate --model "$dir" --prompt-ids "$ids" --max-new-tokens 12 --ignore-eos --threads 1 --chunk 64 \
      --dump-logits "$tmp/$model.$np.f32" >"$tmp/$model.$np.ids" 2>"$tmp/err" || { echo "FAIL $model $np ranks"; cat "$tmp/err"; fail=1; continue; }
    if cmp -s "$tmp/$model.1.ids" "$tmp/$model.$np.ids"; then echo "ok   $model on $np ranks: same greedy ids ($(cat "$tmp/$model.$np.ids"))"
    else echo "FAIL $model on $np ranks: ids '$(cat "$tmp/$model.$np.ids")' vs '$(cat "$tmp/$model.1.ids")'"; fail=1; fi
    compare "$tmp/$model.1.f32" "$tmp/$model.$np.f32" "$model tp $np vs 1" || fail=1
  done
done
exit $fail
