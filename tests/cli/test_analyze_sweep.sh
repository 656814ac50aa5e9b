#!/usr/bin/env bash
# test_analyze_sweep.sh - `ckv analyze` over a list of budgets from one prefill on the fixture model:
# the per-head lines of every budget equal a run at that budget alone; --stats-json holds one summary
# per budget (share of heads where B perturbs less, mean perturbations, bound tightness) consistent
# with the lines; --layerwise has one line per press x budget x layer, exactly 0 where the budget keeps
# every token, positive and finite where it evicts; a bad budget list fails with one line.
# usage: test_analyze_sweep.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/analyze_sweep.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
llama=$fx/llama_gqa
ids=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(','.join(map(str,r['prompt_ids'])))" "$llama/reference.json")
common=(--model "$llama" --prompt-ids "$ids" --question-ids 5,6,7 --threads 2 --press-a snapkv --press-b critical:snapkv)
"$ckv" analyze "${common[@]}" --budget 0.2,0.5,1 --out "$tmp/all.jsonl" --stats-json "$tmp/stats.json" \
  --layerwise "$tmp/layers.jsonl" >"$tmp/table" 2>"$tmp/err" || { echo "FAIL sweep run"; cat "$tmp/err"; fail=1; }
for b in 0.2 0.5 1; do
  "$ckv" analyze "${common[@]}" --budget $b --out "$tmp/one_$b.jsonl" >/dev/null 2>"$tmp/err" ||
    { echo "FAIL budget $b run"; cat "$tmp/err"; fail=1; }
done
python3 - "$tmp" <<'PY' || fail=1
import json, math, sys
d = sys.argv[1]
multi = [json.loads(l) for l in open(d + "/all.jsonl")]
stats = json.load(open(d + "/stats.json"))["budgets"]
layers = [json.loads(l) for l in open(d + "/layers.jsonl")]
assert [s["budget"] for s in stats] == [0.2, 0.5, 1], stats
for b, s in zip(("0.2", "0.5", "1"), stats):
    one = [json.loads(l) for l in open(f"{d}/one_{b}.jsonl")]
    mine = [{k: v for k, v in r.items() if k != "budget"} for r in multi if r["budget"] == float(b)]
    assert mine == one, f"budget {b}: the sweep's lines differ from a run at that budget alone"
    n_less = sum(r["perturbation_b"] < r["perturbation_a"] for r in one)
    assert s["n_heads"] == len(one) and s["n_b_less"] == n_less, (s, n_less)
    assert abs(s["mean_perturbation_a"] - sum(r["perturbation_a"] for r in one) / len(one)) < 1e-9 * (1 + s["mean_perturbation_a"])
n_layers = 1 + max(r["layer"] for r in multi)
assert len(layers) == 2 * 3 * n_layers, len(layers)
for r in layers:
    assert math.isfinite(r["rel_perturbation"]) and r["rel_perturbation"] >= 0, r
    if r["budget"] == 1:
        assert r["rel_perturbation"] == 0 and r["kept_fraction"] == 1, r
    elif r["layer"] == n_layers - 1:
        assert r["rel_perturbation"] > 0 and abs(r["kept_fraction"] - r["budget"]) < 0.02, r
print(f"ok   analyze sweep: {len(multi)} head lines over 3 budgets equal single runs; {len(layers)} layer-wise lines")
PY
"$ckv" analyze "${common[@]}" --budget 0.2,x >"$tmp/out" 2>"$tmp/err"; rc=$?
if [ $rc -eq 0 ] || [ $rc -ge 128 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q -- "--budget" "$tmp/err"; then
  echo "FAIL bad budget list: rc $rc"; cat "$tmp/err"; fail=1
else echo "ok   bad budget list: $(cat "$tmp/err")"; fi
exit $fail
