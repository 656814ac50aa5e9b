#!/usr/bin/env bash
# test_eval_sweep.sh - `ckv eval` prefills each sample once for the whole sweep (engine/sweep.h): on the
# fixture model, a sweep of 6 presses x 2 budgets with its full-cache baseline, context-only and then
# query-aware, gives the same results (predictions, kept fractions, scores, compressed flags) as
# --separate-prefill, which prefills every (sample, configuration) on its own.
# usage: test_eval_sweep.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2; tmp=$(mktemp -d "$3/eval_sweep.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
base=(--model "$fx/models/llama_gqa" --task niah_single_1,niah_multikey_2 --length 700 --samples 2
      --press snapkv,critical:snapkv,knorm,observed_attention,expected_attention,adakv:tova --budget 0.3,0.6
      --max-new-tokens 4 --threads 2 --progress none)
for mode in context query; do
  extra=(); [ "$mode" = query ] && extra=(--query-aware)
  for how in shared separate; do
    flag=(); [ "$how" = separate ] && flag=(--separate-prefill)
    "$ckv" eval "${base[@]}" "${extra[@]}" "${flag[@]}" --out "$tmp/$mode.$how" >/dev/null 2>"$tmp/err" ||
      { echo "FAIL $mode $how run"; cat "$tmp/err"; fail=1; }
  done
  python3 - "$tmp/$mode.shared" "$tmp/$mode.separate" "$mode" <<'PY' || fail=1
import json, sys
def load(d):
    out = {}
    for r in map(json.loads, open(d + "/results.jsonl")):
        out[(r["press_spec"], r["sample"], r["question"])] = (r["prediction"], r["new_tokens"], r["kept_fraction"],
                                                              r["score"], r.get("compressed"), r["context_tokens"])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = [k for k in b if a.get(k) != b[k]] + [k for k in a if k not in b]
for k in bad[:5]:
    print("  mismatch", k, a.get(k), b.get(k))
assert not bad and len(a) == 2 * 2 * 13, (len(bad), len(a))
assert len({v[0] for v in a.values()}) > 5, "the presses should not all answer alike"
print(f"ok   {sys.argv[3]}: {len(a)} results of the shared prefill equal --separate-prefill's")
PY
done
exit $fail
