#!/usr/bin/env bash
# test_profile_heads.sh - `ckv profile-heads` on the fixture model against the independent float64
# NumPy reference (tools/oracle/headscore_reference.py, committed as
# tests/fixtures/presses/headscore_llama_gqa.json): the same seeded probes (token ids and needle
# spans), every query head's score within 1e-6 + 1e-4 relative and the KV heads' means (every probe
# counted: the random fixture answers none, which the reference confirms); the profile is one the
# headkv presses load (an eval with headkv:snapkv runs on it); by default (HeadKV's: only answered
# probes count) the fixture is refused with one line, as is any other bad input.
# usage: test_profile_heads.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2; tmp=$(mktemp -d "$3/profile_heads.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
model=$fx/models/llama_gqa
ref=$fx/presses/headscore_llama_gqa.json
"$ckv" profile-heads --model "$model" --samples 3 --length 200 --count-probes all --threads 2 --out "$tmp/profile.json" \
  --probes-out "$tmp/probes.jsonl" >"$tmp/out" 2>"$tmp/err" || { echo "FAIL profile-heads run"; cat "$tmp/err"; fail=1; }
python3 - "$tmp/profile.json" "$tmp/probes.jsonl" "$ref" <<'PY' || fail=1
import json, sys
got, ref = json.load(open(sys.argv[1])), json.load(open(sys.argv[3]))
probes = [json.loads(l) for l in open(sys.argv[2])]
assert probes == ref["probes"], "the probes differ from the reference's (ids or needle spans)"
assert got["format"] == "ckv-headkv-profile" and got["n_layers"] == len(ref["scores"]) and got["topk"] == ref["topk"]
assert (got["probes_answered"], got["probes_counted"]) == (ref["probes_answered"], ref["probes_counted"]), \
    f"answered/counted probes: ckv {got['probes_answered']}/{got['probes_counted']}, " \
    f"reference {ref['probes_answered']}/{ref['probes_counted']}"
worst, bad = 0.0, []
for key in ("query_head_scores", "scores"):
    for l, (gr, rr) in enumerate(zip(got[key], ref[key])):
        for h, (g, r) in enumerate(zip(gr, rr)):
            err = abs(g - r)
            worst = max(worst, err)
            if err > 1e-6 + 1e-4 * abs(r):
                bad.append((key, l, h, g, r))
for b in bad[:5]:
    print("  mismatch %s layer %d head %d: ckv %.9g, reference %.9g" % b)
assert not bad, f"{len(bad)} scores differ from the reference (max |error| {worst:.3g})"
assert all(v >= 0 for row in got["query_head_scores"] for v in row) and any(v > 0 for row in got["scores"] for v in row)
print(f"ok   profile-heads: {len(probes)} probes, {sum(map(len, got['query_head_scores']))} query heads equal the "
      f"NumPy reference (max |error| {worst:.2g})")
PY
"$ckv" eval --model "$model" --task niah_single_1 --length 700 --samples 1 --press headkv:snapkv --profile "$tmp/profile.json" \
  --budget 0.5 --max-new-tokens 2 --threads 2 --progress none --out "$tmp/eval" >/dev/null 2>"$tmp/err" &&
  grep -q '"press":"headkv:snapkv"' "$tmp/eval/results.jsonl" && echo "ok   the profile drives headkv:snapkv" ||
  { echo "FAIL eval with the computed profile"; cat "$tmp/err"; fail=1; }
expect_error() {
  local name=$1 want=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/all"; local rc=$?
  grep -v '^ckv profile-heads: probe ' "$tmp/all" >"$tmp/err" # the progress lines before the error
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL $name: rc $rc"; cat "$tmp/err"; fail=1
  else echo "ok   $name: $(cat "$tmp/err")"; fi
}
expect_error "no --out" "--out" "$ckv" profile-heads --model "$model"
expect_error "none answered" "answered none of the 2 probes" "$ckv" profile-heads --model "$model" --samples 2 --length 200 \
  --out "$tmp/x.json"
expect_error "bad --count-probes" "--count-probes" "$ckv" profile-heads --model "$model" --count-probes some --out "$tmp/x.json"
expect_error "topk 0" "--topk" "$ckv" profile-heads --model "$model" --topk 0 --out "$tmp/x.json"
expect_error "too long" "context window" "$ckv" profile-heads --model "$model" --length 1000000 --out "$tmp/x.json"
expect_error "bad model" "nonexistent" "$ckv" profile-heads --model "$tmp/nonexistent" --out "$tmp/x.json"
[ ! -e "$tmp/x.json" ] || { echo "FAIL a failed run left $tmp/x.json"; fail=1; }
exit $fail
