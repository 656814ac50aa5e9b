#!/usr/bin/env bash
# test_decode_press.sh - decode-time compression through `ckv generate` and `ckv eval` on the fixture
# model: a target above every cache length changes nothing (answers identical to no decode press);
# a compressing one is reported (stderr, --stats-json, results lines); with several questions on
# one context each question is answered from the context prepared afresh (the second answer of a
# grouped pair equals the answer of a run holding that question alone); --dump-kept logs every
# compression. The kvpress parity is test_decode_press (unit), tensor parallelism mpi_tp_decode.
# usage: test_decode_press.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2; tmp=$(mktemp -d "$3/dec.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
model=$fx/models/llama_gqa
fail=0
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$model/reference.json")
gen=(generate --model "$model" --prompt-ids "$ids" --question-ids 7,8,9 --question-ids 11,12 --max-new-tokens 24
     --ignore-eos --threads 1)
# generate: a target that is never reached changes nothing
"$ckv" "${gen[@]}" >"$tmp/plain" 2>"$tmp/err" || { echo "FAIL generate"; cat "$tmp/err"; fail=1; }
"$ckv" "${gen[@]}" --decode-press knorm --decode-interval 4 --decode-target 100000 >"$tmp/noop" 2>"$tmp/err" \
  || { echo "FAIL generate noop"; cat "$tmp/err"; fail=1; }
if cmp -s "$tmp/plain" "$tmp/noop"; then echo "ok   generate: an unreached target leaves the answers as they are"
else echo "FAIL generate: an unreached target changed the answers"; diff "$tmp/plain" "$tmp/noop"; fail=1; fi
# generate: compressing, two questions; the second equals a run with that question alone
"$ckv" "${gen[@]}" --decode-press keydiff --decode-interval 4 --decode-target 200 --dump-kept "$tmp/kept" \
  --stats-json "$tmp/stats" >"$tmp/cut" 2>"$tmp/err" || { echo "FAIL generate cut"; cat "$tmp/err"; fail=1; }
"$ckv" generate --model "$model" --prompt-ids "$ids" --question-ids 11,12 --max-new-tokens 24 --ignore-eos --threads 1 \
  --decode-press keydiff --decode-interval 4 --decode-target 200 >"$tmp/second" 2>/dev/null || fail=1
if grep -q "decode-time compression: [1-9][0-9]* compressions" "$tmp/err" &&
   python3 -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s['decode_compressions'] > 0 else 1)" "$tmp/stats" &&
   [ "$(grep -c '"step"' "$tmp/kept")" -gt 0 ] && [ "$(sed -n 2p "$tmp/cut")" = "$(sed -n 1p "$tmp/second")" ] &&
   ! cmp -s "$tmp/plain" "$tmp/cut"; then
  echo "ok   generate: compressions reported and logged; the second question sees the context afresh"
else
  echo "FAIL generate with decode-time compression"; cat "$tmp/err"; cat "$tmp/cut" "$tmp/second"; fail=1
fi
# eval: the grouped questions of longbench_mini (two on one context)
ev=(eval --model "$model" --data "$fx/eval/longbench_mini.jsonl" --press knorm --budget 0.5 --threads 1 --progress none
    --max-new-tokens 6)
"$ckv" "${ev[@]}" --out "$tmp/e0" >/dev/null 2>"$tmp/err" || { echo "FAIL eval"; cat "$tmp/err"; fail=1; }
"$ckv" "${ev[@]}" --decode-press knorm --decode-interval 2 --decode-target 100000 --out "$tmp/e1" >/dev/null 2>"$tmp/err" \
  || { echo "FAIL eval noop"; cat "$tmp/err"; fail=1; }
"$ckv" "${ev[@]}" --decode-press knorm --decode-interval 1 --decode-target 40 --out "$tmp/e2" >/dev/null 2>"$tmp/err" \
  || { echo "FAIL eval cut"; cat "$tmp/err"; fail=1; }
sed -n 2p "$fx/eval/longbench_mini.jsonl" >"$tmp/second.jsonl"
"$ckv" eval --model "$model" --data "$tmp/second.jsonl" --press knorm --budget 0.5 --threads 1 --progress none \
  --max-new-tokens 6 --decode-press knorm --decode-interval 1 --decode-target 40 --out "$tmp/e3" >/dev/null 2>"$tmp/err" \
  || { echo "FAIL eval alone"; cat "$tmp/err"; fail=1; }
python3 - "$tmp" <<'PY' || fail=1
import json, sys
d = sys.argv[1]
rows = {k: [json.loads(l) for l in open(f"{d}/{k}/results.jsonl")] for k in ("e0", "e1", "e2", "e3")}
key = lambda r: (r["sample"], r["question"], r["press_spec"])
pred = {k: {key(r): r["prediction"] for r in v} for k, v in rows.items()}
ok = True
if pred["e0"] != pred["e1"]:
    print("FAIL eval: an unreached decode target changed predictions"); ok = False
if not all(r.get("decode_press") == "knorm interval=1 target=40" for r in rows["e2"]):
    print("FAIL eval: results lines lack decode_press"); ok = False
alone = {r["press_spec"]: r["prediction"] for r in rows["e3"]}
second = {r["press_spec"]: r["prediction"] for r in rows["e2"] if r["sample_index"] == 0 and r["question"] == 1}
if not second or second != alone:
    print(f"FAIL eval: the second grouped question differs from the question alone: {second} vs {alone}"); ok = False
if ok:
    print(f"ok   eval: {len(rows['e2'])} results with decode_press; unreached target changes nothing; grouped questions prepared afresh")
sys.exit(0 if ok else 1)
PY
exit $fail
