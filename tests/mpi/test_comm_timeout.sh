#!/usr/bin/env bash
# test_comm_timeout.sh - a rank that stops calling collectives never hangs the job: with a 3 s
# communicator timeout, the ranks waiting in an all-reduce end the job (non-zero exit) within the
# timeout plus a few seconds, and the error names the rank and the operation; the same when the
# others wait in a communicator split or the split by node (2 ranks).
# With `cuda` (tests/gpu/run.sh) the collective runs on the CUDA backend's device communicator
# (staged when the ranks share a GPU, NCCL when each has its own) on NP ranks; with `emu` (its
# rehearsal) on the CUDA backend's CPU execution layer (staged).
# usage: test_comm_timeout.sh COMM_RANKS FIXTURES_DIR TMP_DIR MPIRUN [cuda|emu [NP]]
set -u
bin=$1; tmp=$(mktemp -d "$3/timeout.XXXXXX"); mpirun=$4; dev=${5:-}; nps="2 3"
[ -n "$dev" ] && nps=${6:-2}
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
# expect_stall WHAT NP PATTERN [comm_ranks timeout flag]: the job ends early, the error matching PATTERN
expect_stall() {
  local what=$1 np=$2 pat=$3 flag=${4:-}
  local start rc took msg
  start=$(date +%s)
  timeout 60 "$mpirun" --oversubscribe -np "$np" "$bin" timeout 3 $flag >"$tmp/out" 2>"$tmp/err"
  rc=$?; took=$(( $(date +%s) - start ))
  msg=$(grep -m1 "$pat" "$tmp/err")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ -n "$msg" ] && [ "$took" -le 15 ]; then
    echo "ok   $np ranks, one stalled $what: job ended in ${took}s with exit $rc: $msg"
  else
    echo "FAIL $np ranks, one stalled $what: exit $rc after ${took}s"; cat "$tmp/err"; fail=1
  fi
}
for np in $nps; do
  expect_stall "in an all-reduce${dev:+ ($dev)}" "$np" "all-reduce (float) failed" "$dev"
done
# the communicator splits (MPI offers them only blocking): a rank stalled before them ends the job too
if [ -z "$dev" ]; then
  expect_stall "before a split" 2 "MPI split failed" split
  expect_stall "before the split by node" 2 "MPI split by node failed" node
fi
exit $fail
