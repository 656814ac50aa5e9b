#!/usr/bin/env bash
# bench_sweep.sh - the cost of a press x budget sweep of `ckv eval` prefilled once per sample against
# --separate-prefill (a prefill per sample and configuration), measured in one run: the two are
# alternated ROUNDS times on the same samples and the ratio of the medians is printed with every
# wall time. Also checks that both give the same results.
# usage: bench_sweep.sh CKV MODEL [LENGTH] [SAMPLES] [ROUNDS]   (defaults 2048, 2, 3)
set -euo pipefail
ckv=$1; model=$2; length=${3:-2048}; samples=${4:-2}; rounds=${5:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=(eval --model "$model" --task niah_single_1,niah_multikey_1 --length "$length" --samples "$samples"
      --press snapkv,critical:snapkv,adakv:snapkv,knorm --budget 0.1,0.25,0.5 --max-new-tokens 16 --progress none)
echo "ckv eval: 4 presses x 3 budgets + the full cache, 2 tasks x $samples samples at $length tokens, $rounds rounds"
shared=(); separate=()
for r in $(seq 1 "$rounds"); do
  for how in shared separate; do
    flag=(); [ "$how" = separate ] && flag=(--separate-prefill)
    rm -rf "$tmp/$how"
    t0=$(date +%s.%N)
    "$ckv" "${args[@]}" "${flag[@]}" --out "$tmp/$how" >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
    t=$(echo "$(date +%s.%N) - $t0" | bc)
    echo "round $r $how: ${t} s"
    if [ "$how" = shared ]; then shared+=("$t"); else separate+=("$t"); fi
  done
  python3 - "$tmp/shared" "$tmp/separate" <<'PY'
import json, sys
load = lambda d: {(r["press_spec"], r["sample"], r["question"]): (r["prediction"], r["kept_fraction"])
                  for r in map(json.loads, open(d + "/results.jsonl"))}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a == b, "the shared prefill's results differ from --separate-prefill's"
PY
done
python3 - "${shared[*]}" "${separate[*]}" <<'PY'
import statistics, sys
s = [float(x) for x in sys.argv[1].split()]; p = [float(x) for x in sys.argv[2].split()]
ms, mp = statistics.median(s), statistics.median(p)
print(f"median: shared {ms:.1f} s, separate {mp:.1f} s; separate / shared = {mp / ms:.2f}x (results identical)")
PY
