#!/usr/bin/env bash
# bench_tp.sh - tensor parallelism on one machine: `ckv generate` on 1 rank (all threads) and on
# 2 ranks (half the threads each) over the same prompt, with and without a cross-head press, and
# the communication each rank handed to the collectives (from --stats-json). Prints a markdown table.
#   tools/bench/bench_tp.sh MODEL_DIR [CONTEXT] [NEW_TOKENS]
# MODEL_DIR needs a head count divisible by 2 (e.g. the Qwen2.5-0.5B-shaped model bench_cpu.py
# writes with --keep-model).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
model=${1:?usage: bench_tp.sh MODEL_DIR [CONTEXT] [NEW_TOKENS]}
ctx=${2:-1024}; new=${3:-32}
ckv=${CKV:-$root/build/ckv}
threads=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]+'/config.json'))['vocab_size'])" "$model")
python3 -c "import random,sys; random.seed(1); print(','.join(str(random.randrange(4, int(sys.argv[1]))) for _ in range(int(sys.argv[2]))))" "$vocab" "$ctx" >"$tmp/ids"
echo "| ranks | press | prefill tok/s | decode tok/s | bytes/token (model) | bytes (compression) |"
echo "|---|---|---|---|---|---|"
for press in none critical_adakv:snapkv; do
  pargs=(--press "$press"); [ "$press" = none ] || pargs+=(--budget 0.2)
  for np in 1 2; do
    run=("$ckv" generate --model "$model" --prompt-ids-file "$tmp/ids" --max-new-tokens "$new" --ignore-eos
         --threads $((threads / np)) "${pargs[@]}" --stats-json "$tmp/s.json")
    if [ "$np" = 1 ]; then "${run[@]}" >/dev/null 2>"$tmp/err"; else mpirun --oversubscribe -np 2 --bind-to none "${run[@]}" >/dev/null 2>"$tmp/err"; fi
    python3 - "$tmp/s.json" "$np" "$press" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
toks = s["prefill_tokens"] + s["decode_tokens"]
per = (s.get("comm_bytes", 0) - s.get("comm_bytes_compression", 0)) / max(toks, 1)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['prefill_tok_s']:.1f} | {s['decode_tok_s']:.2f} | {per:,.0f} | {s.get('comm_bytes_compression', 0):,} |")
PY
  done
done
