#!/usr/bin/env bash
# test_analyze_stats.sh - the attention-concentration statistics of `ckv analyze --stats-json` on the
# fixture model llama_gqa against the independent float64 NumPy reference
# (tools/oracle/analyze_stats_reference.py, committed as tests/fixtures/presses/analyze_stats_llama_gqa.json):
# per (layer, query head) the top-1/5/10% shares of the question's attention, the recall of those
# rows among snapkv's top rows, Spearman's rho and the value-norm spread; the same numbers in every
# --out line; the medians over heads; the same statistics whatever press B and the budget are.
# usage: test_analyze_stats.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2; tmp=$(mktemp -d "$3/analyze_stats.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
model=$fx/models/llama_gqa
ref=$fx/presses/analyze_stats_llama_gqa.json
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$model/reference.json")

"$ckv" analyze --model "$model" --prompt-ids "$ids" --budget 0.3 --threads 2 --out "$tmp/heads.jsonl" \
  --stats-json "$tmp/stats.json" >"$tmp/sum" 2>"$tmp/err" || { echo "FAIL analyze run"; cat "$tmp/err"; fail=1; }
"$ckv" analyze --model "$model" --prompt-ids "$ids" --press-b adakv:snapkv --budget 0.1,0.5 --threads 2 \
  --stats-json "$tmp/stats2.json" >"$tmp/sum2" 2>"$tmp/err2" || { echo "FAIL second analyze run"; cat "$tmp/err2"; fail=1; }
python3 - "$tmp/stats.json" "$tmp/heads.jsonl" "$ref" "$tmp/sum" "$tmp/stats2.json" <<'PY' || fail=1
import json, math, statistics, sys
got, ref = json.load(open(sys.argv[1]))["concentration"], json.load(open(sys.argv[3]))
lines = [json.loads(l) for l in open(sys.argv[2])]
assert got["fractions"] == ref["fractions"], (got["fractions"], ref["fractions"])
assert got["scores_of"].startswith("snapkv(window=64,kernel=5,pool=avg)"), got["scores_of"]
assert len(got["heads"]) == len(ref["heads"]) == len(lines) == 12, (len(got["heads"]), len(ref["heads"]), len(lines))
bad, worst, near = [], {"top_share": 0.0, "spearman": 0.0, "norm_spread": 0.0}, 0
for g, r, l in zip(got["heads"], ref["heads"], lines):
    where = "layer %d head %d" % (r["layer"], r["head"])
    assert (g["layer"], g["head"], g["kv_head"]) == (r["layer"], r["head"], r["kv_head"]), (g, r)
    assert g["top_k"] == r["top_k"] == l["top_k"], (where, g["top_k"], r["top_k"])
    for key in ("top_share", "recall", "spearman", "norm_spread"):  # the --out line carries the same numbers
        gv, lv = (g[key], l[key]) if isinstance(g[key], list) else ([g[key]], [l[key]])
        assert all(abs(x - y) <= 1e-13 * max(1.0, abs(y)) for x, y in zip(gv, lv)), (where, key, g[key], l[key])
    for t in range(3):
        e = abs(g["top_share"][t] - r["top_share"][t]); worst["top_share"] = max(worst["top_share"], e)
        if e > 1e-6: bad.append((where, "top_share[%d]" % t, g["top_share"][t], r["top_share"][t]))
        # ckv ranks fp32 scores, the reference float64: one row may cross the cut on a near-tie
        if g["recall"][t] != r["recall"][t]:
            if abs(g["recall"][t] - r["recall"][t]) * g["top_k"][t] > 1 + 1e-9:
                bad.append((where, "recall[%d]" % t, g["recall"][t], r["recall"][t]))
            near += 1
    for key, tol in (("spearman", 1e-4), ("norm_spread", 1e-5)):
        e = abs(g[key] - r[key]) / max(1.0, abs(r[key])); worst[key] = max(worst[key], e)
        if e > tol: bad.append((where, key, g[key], r[key]))
for b in bad[:5]:
    print("  mismatch %s %s: ckv %.9g, reference %.9g" % b)
assert not bad, "%d statistics differ from the reference (max errors %s)" % (len(bad), worst)
assert near <= 2, "%d recalls differ by one row from the reference (near-ties)" % near
assert all(0 < h["top_share"][0] <= h["top_share"][1] <= h["top_share"][2] <= 1 for h in got["heads"])
assert all(h["norm_spread"] >= 1 and -1 <= h["spearman"] <= 1 for h in got["heads"])
med = got["median"]
for t in range(3):
    assert abs(med["top_share"][t] - statistics.median(h["top_share"][t] for h in got["heads"])) < 1e-12, med
assert abs(med["spearman"] - statistics.median(h["spearman"] for h in got["heads"])) < 1e-12, med
s = open(sys.argv[4]).read()
assert "attention concentration (medians over heads" in s and ("hold %.3f/" % med["top_share"][0]) in s, s
other = json.load(open(sys.argv[5]))["concentration"]                 # press B and the budgets do not matter
assert other["heads"] == got["heads"], "the statistics changed with press B or the budget"  # same printing: exact
print("ok   concentration statistics of 12 heads equal the NumPy reference (max errors: top_share %.2g, "
      "spearman %.2g, norm_spread %.2g; %d recall(s) one row apart on a near-tie)"
      % (worst["top_share"], worst["spearman"], worst["norm_spread"], near))
PY
exit $fail
