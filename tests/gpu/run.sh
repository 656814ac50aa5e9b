#!/usr/bin/env bash
# run.sh - the one prepared script for a machine with NVIDIA GPUs: builds ckv with CUDA and NCCL,
# runs every CTest test labelled cuda (and the CPU suite as a sanity check), runs NCCL across all
# visible GPUs when there are several, and writes a summary with the device, versions and results.
#   tests/gpu/run.sh [OUT_DIR]        (OUT_DIR defaults to $OUT, else build-gpu/results)
# Exits non-zero if any test failed; a test that cannot run reports itself as skipped.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-${OUT:-$root/build-gpu/results}}
mkdir -p "$out"
log() { echo "$*" | tee -a "$out/summary.txt"; }
: >"$out/summary.txt"
log "== device"
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi not available") | tee -a "$out/summary.txt"
log "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
"$root/tools/setup.sh" >/dev/null || { log "setup failed"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log "== build (CUDA on)"
cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release -DCKV_CUDA=ON >"$out/cmake.log" 2>&1 \
  || cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release >>"$out/cmake.log" 2>&1
grep "ckv:" "$out/cmake.log" | tee -a "$out/summary.txt"
cmake --build "$root/build-gpu" -j "$(nproc)" >"$out/build.log" 2>&1 || { log "build failed (see build.log)"; tail -20 "$out/build.log"; exit 1; }
status=0
log "== tests: cuda"
ctest --test-dir "$root/build-gpu" -L cuda --output-on-failure >"$out/ctest-cuda.log" 2>&1 || status=1
grep -E "tests passed|Passed|Failed|Skipped|SKIP" "$out/ctest-cuda.log" | tee -a "$out/summary.txt"
log "== tests: cpu + mpi (sanity)"
ctest --test-dir "$root/build-gpu" -L 'cpu|mpi' -j "$(nproc)" >"$out/ctest-cpu.log" 2>&1 || status=1
grep -E "tests passed" "$out/ctest-cpu.log" | tee -a "$out/summary.txt"
ngpu=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -ge 2 ] && [ -x "$root/build-gpu/tests/test_comm_nccl" ]; then
  log "== NCCL on $ngpu GPUs"
  mpirun --oversubscribe -np "$ngpu" "$root/build-gpu/tests/test_comm_nccl" >"$out/nccl.log" 2>&1 || status=1
  tail -3 "$out/nccl.log" | tee -a "$out/summary.txt"
fi
log "== status $status"
exit $status
