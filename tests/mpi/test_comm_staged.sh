#!/usr/bin/env bash
# test_comm_staged.sh - the staged device communicator on 2 and 3 MPI ranks of the CPU backend (fake
# device ids make every rank "share one GPU"): its collectives equal MPI's, the path is chosen the
# same on every rank, and a random-weights model at tp 2 through it equals tp 1 (logits and greedy
# tokens), tp 1 being identical across runs; the same on the CUDA backend's CPU execution layer
# (cuda-emu) where the build has it.
# usage: test_comm_staged.sh COMM_RANKS FIXTURES_DIR TMP_DIR MPIRUN
set -u
bin=$1; fx=$2; mpirun=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
for np in 2 3; do
  if timeout 120 "$mpirun" --oversubscribe -np $np "$bin" staged; then echo "ok   staged collectives on $np ranks"
  else echo "FAIL staged collectives on $np ranks"; fail=1; fi
done
if timeout 240 "$mpirun" --oversubscribe -np 2 "$bin" tp "$fx/random/tiny_qwen2"; then
  echo "ok   random weights: tp 2 through the staged path equals tp 1"
else echo "FAIL random weights tp 2 (staged) vs tp 1"; fail=1; fi
# the CUDA backend's kernels on the CPU execution layer: device buffers the model cannot read as host
timeout 240 "$mpirun" --oversubscribe -np 2 "$bin" tp "$fx/random/tiny_qwen2" emu >"$3/staged_emu.log" 2>&1; rc=$?
if [ $rc -eq 0 ]; then echo "ok   random weights on cuda-emu: tp 2 through the staged path equals tp 1"
elif [ $rc -eq 77 ]; then echo "skip cuda-emu: $(grep -m1 SKIP "$3/staged_emu.log")"
else echo "FAIL random weights on cuda-emu: tp 2 (staged) vs tp 1 (exit $rc)"; tail -20 "$3/staged_emu.log"; fail=1; fi
exit $fail
