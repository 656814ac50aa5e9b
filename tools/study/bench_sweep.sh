#!/usr/bin/env bash
# bench_sweep.sh - the cost of a press x budget sweep of `ckv eval` prefilled once per sample against
# --separate-prefill (a prefill per sample and configuration), measured in one run: the two are
# alternated ROUNDS times on the same samples and the ratios of the medians are printed, of the CPU
# time (user + system, what the work costs; robust on a shared machine) and of the wall time. Also
# checks that both give the same results.
# usage: bench_sweep.sh CKV MODEL [LENGTH] [SAMPLES] [ROUNDS]   (defaults 2048, 2, 3)
set -euo pipefail
ckv=$1; model=$2; length=${3:-2048}; samples=${4:-2}; rounds=${5:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=(eval --model "$model" --task niah_single_1,niah_multikey_1 --length "$length" --samples "$samples"
      --press snapkv,critical:snapkv,adakv:snapkv,knorm --budget 0.1,0.25,0.5 --max-new-tokens 16 --progress none)
echo "ckv eval: 4 presses x 3 budgets + the full cache, 2 tasks x $samples samples at $length tokens, $rounds rounds"
shared=(); separate=(); shared_w=(); separate_w=()
TIMEFORMAT='%R %U %S'
for r in $(seq 1 "$rounds"); do
  for how in shared separate; do
    flag=(); [ "$how" = separate ] && flag=(--separate-prefill)
    rm -rf "$tmp/$how"
    { time "$ckv" "${args[@]}" "${flag[@]}" --out "$tmp/$how" >/dev/null 2>"$tmp/err"; } 2>"$tmp/time" ||
      { cat "$tmp/err"; exit 1; }
    read -r wall user sys <"$tmp/time"
    cpu=$(echo "$user + $sys" | bc)
    echo "round $r $how: cpu ${cpu} s, wall ${wall} s"
    if [ "$how" = shared ]; then shared+=("$cpu"); shared_w+=("$wall"); else separate+=("$cpu"); separate_w+=("$wall"); fi
  done
  python3 - "$tmp/shared" "$tmp/separate" <<'PY'
import json, sys
load = lambda d: {(r["press_spec"], r["sample"], r["question"]): (r["prediction"], r["kept_fraction"])
                  for r in map(json.loads, open(d + "/results.jsonl"))}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a == b, "the shared prefill's results differ from --separate-prefill's"
PY
done
python3 - "${shared[*]}" "${separate[*]}" "${shared_w[*]}" "${separate_w[*]}" <<'PY'
import statistics, sys
med = lambda s: statistics.median(float(x) for x in s.split())
cs, cp, ws, wp = (med(a) for a in sys.argv[1:5])
print(f"median cpu: shared {cs:.1f} s, separate {cp:.1f} s, separate / shared = {cp / cs:.2f}x")
print(f"median wall: shared {ws:.1f} s, separate {wp:.1f} s, separate / shared = {wp / ws:.2f}x (results identical)")
PY
