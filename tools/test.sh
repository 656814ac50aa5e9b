#!/usr/bin/env bash
# test.sh - the one test command: installs the dependencies (tools/setup.sh), builds ckv, runs every
# CPU and MPI test with CTest, then rebuilds the loaders with AddressSanitizer + UBSan and runs the
# loader and bad-input tests there. Exits non-zero on the first failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)

"$root/tools/setup.sh"

# mpirun refuses to start as root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# the tests pick their own thread counts; keep OpenBLAS from oversubscribing the machine
export OPENBLAS_NUM_THREADS=1

echo "== build (Release)"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j "$jobs"
echo "== tests (cpu, mpi)"
ctest --test-dir "$root/build" -L 'cpu|mpi' --output-on-failure -j "$jobs"

echo "== build (ASan + UBSan) and loader / bad-input tests"
cmake -S "$root" -B "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DCKV_SANITIZE=ON -DCKV_CUDA=OFF >/dev/null
cmake --build "$root/build-asan" -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$root/build-asan" -L sanitize --output-on-failure -j "$jobs"
