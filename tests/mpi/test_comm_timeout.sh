#!/usr/bin/env bash
# test_comm_timeout.sh - a rank that stops calling collectives never hangs the job: with a 3 s
# communicator timeout, the ranks waiting in an all-reduce end the job (non-zero exit) within the
# timeout plus a few seconds, and the error names the rank and the operation.
# With `cuda` (tests/gpu/run.sh) the collective runs on the CUDA backend's device communicator
# (staged when the ranks share a GPU, NCCL when each has its own) on NP ranks.
# usage: test_comm_timeout.sh COMM_RANKS FIXTURES_DIR TMP_DIR MPIRUN [cuda [NP]]
set -u
bin=$1; tmp=$(mktemp -d "$3/timeout.XXXXXX"); mpirun=$4; dev=${5:-}; nps="2 3"
[ -n "$dev" ] && nps=${6:-2}
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
for np in $nps; do
  start=$(date +%s)
  timeout 60 "$mpirun" --oversubscribe -np $np "$bin" timeout 3 $dev >"$tmp/out" 2>"$tmp/err"
  rc=$?; took=$(( $(date +%s) - start ))
  msg=$(grep -m1 "all-reduce (float) failed" "$tmp/err")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ -n "$msg" ] && [ "$took" -le 15 ]; then
    echo "ok   $np ranks${dev:+ ($dev)}, one stalled: job ended in ${took}s with exit $rc: $msg"
  else
    echo "FAIL $np ranks, one stalled: exit $rc after ${took}s"; cat "$tmp/err"; fail=1
  fi
done
exit $fail
