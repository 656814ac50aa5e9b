#!/usr/bin/env bash
# test_merge_summary.sh - tools/study/merge_summary.py on the study's committed summaries: the 8-task
# part alone gives that file back byte for byte (its means computed as ckv eval computed them); the
# 8-task part plus the other 3 tasks' rows give the committed 11-task summary byte for byte; a task in
# two parts and a file that is not a summary are refused with one line and exit 1.
# usage: test_merge_summary.sh CKV_BINARY FIXTURES_DIR TMP_DIR   (the binary and fixtures are unused)
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "$3/merge.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
merge=$src/tools/study/merge_summary.py
eight=$src/docs/study/qwen05b-ruler-summary-8tasks.json all=$src/docs/study/qwen05b-ruler-summary.json
fail=0
python3 "$merge" --out "$tmp/a" "$eight" 2>/dev/null &&
  cmp -s "$tmp/a/summary.json" "$eight" && echo "ok   one part: its summary.json back byte for byte" ||
  { echo "FAIL one part: $(cmp "$tmp/a/summary.json" "$eight" 2>&1)"; fail=1; }
# the 3 later tasks' rows, as their own summary
python3 - "$all" "$tmp/three.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["task"] in ("cwe", "niah_multiquery", "niah_multivalue")]
json.dump({"rows": rows}, open(sys.argv[2], "w"))
PY
python3 "$merge" --out "$tmp/b" "$eight" "$tmp/three.json" 2>/dev/null &&
  cmp -s "$tmp/b/summary.json" "$all" && cmp -s "$tmp/b/summary.md" "${all%.json}.md" &&
  echo "ok   two parts: the committed 11-task summary (json and table) byte for byte" ||
  { echo "FAIL two parts: $(cmp "$tmp/b/summary.json" "$all" 2>&1)"; fail=1; }
out=$(python3 "$merge" --out "$tmp/c" "$eight" "$eight" 2>&1); rc=$?
[ "$rc" = 1 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "is in both" &&
  echo "ok   a task in two parts: $out" || { echo "FAIL a task in two parts: rc $rc: $out"; fail=1; }
echo '{"rows": 3' >"$tmp/bad.json"
out=$(python3 "$merge" --out "$tmp/d" "$tmp/bad.json" 2>&1); rc=$?
[ "$rc" = 1 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "not an eval summary.json" &&
  echo "ok   not a summary: $out" || { echo "FAIL not a summary: rc $rc: $out"; fail=1; }
exit $fail
