#!/usr/bin/env bash
# test_analyze.sh - drives `ckv analyze` on the fixture model llama_gqa with its reference prompt:
# the --out file has one JSON line per (layer, query head) with every field; every perturbation is
# <= theta <= the attention-only bound (Theorem 3.3 and its relaxation: asserted, up to a relative
# 1e-9 of rounding); each press's own bound is the right one; everything is exactly 0 when the budget
# keeps every token (--budget 1); question ids add never-evicted rows; bf16 weights and KV (o_proj
# converted for the measurement) keep the bounds; and every bad input ends with
# exit status 1 or 2 and ONE line on stderr that names what is wrong.
# usage: test_analyze.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/analyze.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
llama=$fx/llama_gqa

if "$ckv" analyze --help 2>&1 | grep -q "unknown command"; then
  echo "SKIP: this ckv has no 'analyze' command (src/cli/main.c does not dispatch it yet)"; exit 77
fi

. "$(dirname "$0")/../common/expect.sh" # expect_error

ids=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(','.join(map(str,r['prompt_ids'])))" "$llama/reference.json")
echo "$ids" >"$tmp/prompt.txt"

# check_jsonl FILE N_ROWS KEPT ZERO CRITICAL_A CRITICAL_B: shape, order, bounds (python asserts)
check_jsonl() {
  python3 - "$@" <<'PY'
import json, sys
path, n_rows, kept, zero, crit_a, crit_b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "1", sys.argv[6] == "1"
rows = [json.loads(l) for l in open(path)]
fields = ["layer", "head", "kv_head", "n_rows", "kept_a", "kept_b", "mass_a", "mass_b", "out_l1", "max_norm",
          "perturbation_a", "perturbation_b", "theta_a", "theta_b", "attn_bound_a", "attn_bound_b", "bound_a", "bound_b",
          "top_k", "top_share", "recall", "spearman", "norm_spread"]  # the last five: test_analyze_stats.sh
assert len(rows) == 3 * 4, len(rows)                          # 3 layers x 4 query heads
for i, r in enumerate(rows):
    assert sorted(r) == sorted(fields), sorted(r)
    assert (r["layer"], r["head"]) == (i // 4, i % 4), (i, r["layer"], r["head"])
    assert r["kv_head"] == r["head"] // 2 and r["n_rows"] == n_rows, r   # GQA: 2 query heads per KV head
    assert r["out_l1"] > 0 and r["max_norm"] > 0, r
    for p in "ab":
        pert, theta, att = r["perturbation_" + p], r["theta_" + p], r["attn_bound_" + p]
        # Theorem 3.3 (Eq. 5) and the attention-weight-only relaxation: L <= theta <= 2 (1 - s) max ||V W_O||_1
        assert 0 <= pert <= theta * (1 + 1e-9), (p, pert, theta, r)
        assert theta <= att * (1 + 1e-9), (p, theta, att, r)
        assert abs(att - 2 * (1 - r["mass_" + p]) * r["max_norm"]) <= 1e-9 * r["max_norm"], r
        crit = crit_a if p == "a" else crit_b
        assert r["bound_" + p] == (theta if crit else att), r
        if kept != "-":
            assert r["kept_" + p] == int(kept), (p, r["kept_" + p], kept)
        if zero:
            assert pert == 0 and theta == 0 and att == 0 and r["mass_" + p] == 1, r
        else:
            assert pert > 0 and 0 < r["mass_" + p] < 1, r
print("ok   %s: %d heads, perturbation <= theta <= attention-only bound everywhere" % (path.split("/")[-1], len(rows)))
PY
}

# --- a good run: snapkv vs critical:snapkv at budget 0.3 (kept floor(240 * 0.3) = 72 per head) ---
"$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.3 --threads 2 --out "$tmp/heads.jsonl" \
  >"$tmp/sum" 2>"$tmp/err" || { echo "FAIL analyze run"; cat "$tmp/err"; fail=1; }
check_jsonl "$tmp/heads.jsonl" 241 72 0 0 1 || fail=1
python3 - "$tmp/sum" "$tmp/heads.jsonl" <<'PY' || fail=1
import json, re, sys
s = open(sys.argv[1]).read(); rows = [json.loads(l) for l in open(sys.argv[2])]
assert "press A: snapkv(window=64,kernel=5,pool=avg) budget=0.3" in s, s
assert "press B: critical(alpha=0.5,eps=0.0001):snapkv(window=64,kernel=5,pool=avg) budget=0.3" in s, s
m = re.search(r"B perturbs less than A in (\d+) of 12 heads", s); assert m, s
assert int(m.group(1)) == sum(r["perturbation_b"] < r["perturbation_a"] for r in rows), (m.group(1), s)
m = re.search(r"mean \|\|o - o\^\|\|_1: A ([0-9.e+-]+), B ([0-9.e+-]+)", s); assert m, s
mean_a = sum(r["perturbation_a"] for r in rows) / 12
assert abs(float(m.group(1)) - mean_a) <= 1e-5 * mean_a, (m.group(1), mean_a)
m = re.search(r"mean bound ratio \(bound / perturbation\): A ([0-9.e+-]+) \(attention-only bound, 12 heads\); B ([0-9.e+-]+) \(theta, 12 heads\)", s); assert m, s
ratio_b = sum(r["bound_b"] / r["perturbation_b"] for r in rows) / 12
assert abs(float(m.group(2)) - ratio_b) <= 1e-3 * ratio_b, (m.group(2), ratio_b)
assert "bounds: perturbation <= theta <= attention-only bound in every head" in s, s
print("ok   summary agrees with the per-head file:", s.splitlines()[3])
PY

# --- bf16 weights and KV on the cpu: o_proj converted to fp32 for the measurement, the bounds hold ---
"$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.3 --weights-dtype bf16 --kv-dtype bf16 \
  --out "$tmp/bf16.jsonl" >"$tmp/sum" 2>"$tmp/err" || { echo "FAIL bf16 run"; cat "$tmp/err"; fail=1; }
check_jsonl "$tmp/bf16.jsonl" 241 72 0 0 1 || fail=1

# --- cross-head presses, a question (3 never-evicted rows), options shared by both presses ---
"$ckv" analyze --model "$llama" --prompt-ids-file "$tmp/prompt.txt" --question-ids 5,6,7 --press-a adakv:snapkv \
  --press-b critical_adakv:snapkv --compression-ratio 0.6 --window 32 --pool max --kernel 7 --chunk 50 \
  --out "$tmp/ada.jsonl" >"$tmp/sum" 2>"$tmp/err" || { echo "FAIL adakv run"; cat "$tmp/err"; fail=1; }
check_jsonl "$tmp/ada.jsonl" 243 - 0 0 1 || fail=1
python3 - "$tmp/ada.jsonl" "$tmp/sum" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]; s = open(sys.argv[2]).read()
for p in "ab":  # adakv: per layer, the KV heads share 2 x floor(240 * 0.4) = 192 kept rows
    for layer in range(3):
        assert sum(r["kept_" + p] for r in rows if r["layer"] == layer and r["head"] % 2 == 0) == 2 * 96, (p, layer)
assert "snapkv(window=32,kernel=7,pool=max) cr=0.6" in s, s
print("ok   adakv presses with a 3-token question")
PY

# --- headkv presses: per-head budgets from the fixture profile ---
prof=$2/presses/headkv_profile_llama_gqa.json
"$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-a headkv:snapkv --press-b critical_headkv:snapkv \
  --profile "$prof" --budget 0.3 --out "$tmp/headkv.jsonl" >"$tmp/sum" 2>"$tmp/err" || { echo "FAIL headkv run"; cat "$tmp/err"; fail=1; }
check_jsonl "$tmp/headkv.jsonl" 241 - 0 0 1 || fail=1
python3 - "$tmp/headkv.jsonl" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
kept = {(r["layer"], r["kv_head"]): (r["kept_a"], r["kept_b"]) for r in rows}
assert all(a == b for a, b in kept.values()), kept             # same profile, same budgets for both presses
assert len(set(a for a, _ in kept.values())) > 1, kept          # budgets differ across heads
assert all(64 < a <= 240 for a, _ in kept.values()), kept       # the window (64) plus a share
print("ok   headkv presses: kept per (layer, KV head)", sorted(kept.items()))
PY
expect_error "headkv profile of another model" "2 layers" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-b headkv:snapkv --profile "$2/presses/headkv_profile_qwen2_bias.json" --budget 0.3

# --- a budget that keeps everything: no perturbation, bounds 0 ---
"$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 1 --out "$tmp/full.jsonl" >"$tmp/sum" 2>"$tmp/err" \
  || { echo "FAIL budget 1 run"; cat "$tmp/err"; fail=1; }
check_jsonl "$tmp/full.jsonl" 241 240 1 0 1 || fail=1
grep -q "B perturbs less than A in 0 of 12 heads (0.0%); equal in 12" "$tmp/sum" || { echo "FAIL budget 1 summary"; cat "$tmp/sum"; fail=1; }

# --- tokens budget, other scorers; no --out (summary only) ---
"$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-a tova --press-b critical:knorm --budget-tokens 50 \
  --out "$tmp/tok.jsonl" >"$tmp/sum" 2>"$tmp/err" || { echo "FAIL budget-tokens run"; cat "$tmp/err"; fail=1; }
check_jsonl "$tmp/tok.jsonl" 241 50 0 0 1 || fail=1
"$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.5 >"$tmp/sum" 2>"$tmp/err" && grep -q "of 12 heads" "$tmp/sum" \
  || { echo "FAIL run without --out"; cat "$tmp/err" "$tmp/sum"; fail=1; }

# --- bad input: one line each ---
expect_error "missing --model" "--model is required" "$ckv" analyze --prompt-ids 1,2 --budget 0.5
expect_error "unknown flag" "unknown flag '--bogus'" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.5 --bogus
expect_error "no prompt" "exactly one of --prompt-ids and --prompt-ids-file" "$ckv" analyze --model "$llama" --budget 0.5
expect_error "both prompt flags" "exactly one of" "$ckv" analyze --model "$llama" --prompt-ids 1 --prompt-ids-file "$tmp/prompt.txt" --budget 0.5
expect_error "missing prompt file" "nope.txt" "$ckv" analyze --model "$llama" --prompt-ids-file "$tmp/nope.txt" --budget 0.5
expect_error "bad prompt ids" "'x' at token 1" "$ckv" analyze --model "$llama" --prompt-ids 1,x,3 --budget 0.5
expect_error "bad question ids" "--question-ids: '-4' at token 1" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --question-ids 3,-4 --budget 0.5
expect_error "two questions" "--question-ids given twice" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --question-ids 3 --question-ids 4 --budget 0.5
expect_error "no budget" "needs a budget" "$ckv" analyze --model "$llama" --prompt-ids "$ids"
expect_error "budget zero" "budget 0 is outside (0, 1]" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0
expect_error "budget above one" "budget 1.5 is outside (0, 1]" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 1.5
expect_error "compression ratio one" "compression_ratio 1 is outside [0, 1)" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --compression-ratio 1
expect_error "budget tokens zero" "budget_tokens 0 must be >= 1" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget-tokens 0
expect_error "unknown press" "unknown press 'nonsense'" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-b nonsense --budget 0.5
expect_error "press none" "--press-a none" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-a none --budget 0.5
expect_error "headkv without profile" "profile" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-b headkv:snapkv --budget 0.5
expect_error "even kernel" "kernel: 4 must be odd" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --kernel 4 --budget 0.5
expect_error "unknown press option" "unknown press option 'foo'" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-opt foo=1 --budget 0.5
expect_error "malformed press option" "expected KEY=VALUE" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --press-opt foo --budget 0.5
expect_error "window longer than context" "window 64 needs a context longer than 64 tokens, got 20" "$ckv" analyze --model "$llama" --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 --budget 0.5
expect_error "chunk zero" "--chunk: 0 is outside" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.5 --chunk 0
expect_error "threads word" "--threads: expected an integer, got 'two'" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.5 --threads two
expect_error "flag without value" "--out needs a value" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.5 --out
expect_error "unwritable --out" "--out: cannot write '$tmp/no/dir/h.jsonl'" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --budget 0.5 --out "$tmp/no/dir/h.jsonl"
expect_error "token outside vocabulary" "outside the vocabulary" "$ckv" analyze --model "$llama" --prompt-ids "$ids" --question-ids 99999 --budget 0.5
expect_error "missing model dir" "no such model file or directory" "$ckv" analyze --model "$tmp/none" --prompt-ids "$ids" --budget 0.5
python3 -c "print(','.join(['5']*1100))" >"$tmp/long.txt"
expect_error "prompt too long" "max_position_embeddings" "$ckv" analyze --model "$llama" --prompt-ids-file "$tmp/long.txt" --budget 0.5

exit $fail
