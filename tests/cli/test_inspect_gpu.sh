#!/usr/bin/env bash
# test_inspect_gpu.sh - `ckv inspect --backend cuda` prints the GPU memory plan per rank (reading only
# config.json) and --gpu-mem-limit fails with one stderr line naming the rank and the part that does
# not fit: Qwen2.5-32B at 130000 + 1024 tokens with critical_adakv:snapkv at budget 0.2 fits an H200
# (141 GB) at tp 1 and not 70 GB; tp 4 prints four ranks; bad flags end with a clear error.
# usage: test_inspect_gpu.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; cfgs=$2/../../configs/models; tmp=$(mktemp -d "$3/inspect.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
q32="$cfgs/qwen2.5-32b-instruct-128k"
args=(inspect --model "$q32" --backend cuda --context 130000 --new-tokens 1024 --chunk 2048 --press critical_adakv:snapkv --budget 0.2)
if "$ckv" "${args[@]}" --gpu-mem-limit 141000000000 >"$tmp/out" 2>"$tmp/err" && grep -q "^GPU memory plan per rank: tp 1" "$tmp/out" \
   && grep -Eq "^total +[0-9.]+ GiB" "$tmp/out" && grep -q "^eviction scratch" "$tmp/out"; then
  echo "ok   32B@130K plan fits 141 GB: $(grep '^total' "$tmp/out")"
else echo "FAIL 32B@130K plan on 141 GB"; cat "$tmp/out" "$tmp/err"; fail=1; fi
"$ckv" "${args[@]}" --gpu-mem-limit 70000000000 >"$tmp/out" 2>"$tmp/err"; rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "rank 0 does not fit in GPU memory: part 'KV cache'" "$tmp/err"; then
  echo "ok   70 GB limit: $(cat "$tmp/err")"
else echo "FAIL 70 GB limit: exit $rc"; cat "$tmp/err"; fail=1; fi
if "$ckv" "${args[@]}" --tp 4 >"$tmp/out" 2>&1 && grep -Eq "^rank +0 +1 +2 +3$" "$tmp/out" && grep -q "NCCL" "$tmp/out"; then
  echo "ok   tp 4 prints four ranks"
else echo "FAIL tp 4 plan"; cat "$tmp/out"; fail=1; fi
for bad in "--gpu-mem-limit 1e9" "--backend tpu"; do
  # shellcheck disable=SC2086
  "$ckv" inspect --model "$q32" $bad >"$tmp/out" 2>"$tmp/err"; rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ]; then echo "ok   $bad: $(cat "$tmp/err")"
  else echo "FAIL $bad: exit $rc"; cat "$tmp/err"; fail=1; fi
done
exit $fail
