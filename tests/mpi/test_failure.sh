#!/usr/bin/env bash
# test_failure.sh - a failure on one rank ends the whole job quickly with the failing rank's error:
# (1) rank 1 is given a corrupt checkpoint while rank 0 has a good one (MPMD launch): rank 1 prints
#     its error, aborts, and rank 0 — waiting in a collective — is taken down too, non-zero exit;
# (2) rank 1 is killed with SIGKILL in the middle of a long run: every rank is gone and mpirun
#     exits non-zero within the bound. Neither may hang (each run is bounded by `timeout`).
# usage: test_failure.sh CKV_BINARY FIXTURES_DIR TMP_DIR MPIRUN
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/fail.XXXXXX"); mpirun=$4
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
good=$fx/llama_gqa
# a corrupt header of the same size: the ranks' start-up agreement (file sizes, config) passes, the load fails
cp -r "$good" "$tmp/bad"; printf '\xff\xff\xff\xff\xff\xff\x00\x00' | dd of="$tmp/bad/model.safetensors" bs=1 seek=0 conv=notrunc 2>/dev/null
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$good/reference.json")

# (1) a bad file on one "node"
start=$(date +%s)
timeout 60 "$mpirun" --oversubscribe -np 1 "$ckv" generate --model "$good" --prompt-ids "$ids" --max-new-tokens 4 : \
  -np 1 "$ckv" generate --model "$tmp/bad" --prompt-ids "$ids" --max-new-tokens 4 >"$tmp/out1" 2>"$tmp/err1"
rc=$?; took=$(( $(date +%s) - start ))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "ckv\[1\]: error: .*bad/model.safetensors" "$tmp/err1" && [ "$took" -le 30 ]; then
  echo "ok   bad checkpoint on rank 1: job ended in ${took}s with exit $rc: $(grep -m1 'ckv\[1\]' "$tmp/err1")"
else
  echo "FAIL bad checkpoint on rank 1: exit $rc after ${took}s"; cat "$tmp/err1"; fail=1
fi

# (2) a rank killed mid-run: 40 questions of 700 tokens keep the job busy for many seconds
qs=(); for i in $(seq 1 40); do qs+=(--question-ids "$i,$((i + 1))"); done
start=$(date +%s)
timeout 120 "$mpirun" --oversubscribe -np 2 "$ckv" generate --model "$good" --prompt-ids "$ids" "${qs[@]}" \
  --max-new-tokens 700 --ignore-eos --threads 1 >"$tmp/out2" 2>"$tmp/err2" &
job=$!
victim=""
for _ in $(seq 1 100); do  # find rank 1's process once it is running
  victim=$(pgrep -f -n -- "^$ckv generate --model $good" || true)
  [ -n "$victim" ] && [ "$(pgrep -f -c -- "^$ckv generate --model $good")" -ge 2 ] && break
  sleep 0.1
done
sleep 1
if [ -n "$victim" ] && kill -0 "$job" 2>/dev/null; then
  kill -9 "$victim"
  wait "$job"; rc=$?; took=$(( $(date +%s) - start ))
  left=$(pgrep -f -c -- "^$ckv generate --model $good" || true)
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "${left:-0}" -eq 0 ] && [ "$took" -le 60 ]; then
    echo "ok   killed rank: job ended in ${took}s with exit $rc, no rank left"
  else
    echo "FAIL killed rank: exit $rc after ${took}s, $left ranks left"; tail -5 "$tmp/err2"; fail=1
  fi
else
  wait "$job"; echo "FAIL killed rank: the job ended before a rank could be killed (exit $?)"; tail -5 "$tmp/err2"; fail=1
fi
exit $fail
