#!/usr/bin/env bash
# test_gpu_module.sh - the GPU module (libckv_cuda.so: the CUDA backend and NCCL, loaded on first use;
# src/core/gpu_module.h) in a build with CUDA, on any machine:
#   - the ckv binary links no CUDA library (a CPU run never maps them) and a CPU run works without the
#     module at all;
#   - every ckv function the module calls is exported by the ckv binary (else dlopen would fail);
#   - `--backend cuda` loads the module: it runs (a GPU) or fails naming the GPU, never the module;
#   - a module that is missing is one error line naming where ckv looked, exit 1;
#   - entry points are looked up by name in the module only: a module of another interface version
#     and one without the backend's entry point are refused, each in one line.
# usage: test_gpu_module.sh CKV FIXTURES
set -u
ckv=$1; fx=$2/models/llama_gqa
dir=$(dirname "$ckv"); mod=$dir/libckv_cuda.so
[ -f "$mod" ] || { echo "SKIP: this build has no GPU module (no CUDA at configure time)"; exit 77; }
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
libs=$(ldd "$ckv" | grep -Ei 'libcuda|cublas|nccl' || true)
[ -z "$libs" ] && ok "ckv links no CUDA library" || bad "ckv links CUDA libraries: $libs"
if CKV_GPU_MODULE=/nonexistent/libckv_cuda.so "$ckv" generate -m "$fx" --prompt-ids 1,2,3 -n 2 >/dev/null 2>&1; then
  ok "a CPU run works without the module"
else
  bad "a CPU run needs the module"
fi
if command -v nm >/dev/null; then
  missing=$(comm -23 <(nm -D --undefined-only "$mod" | awk '{print $2}' | grep '^ckv_' | sort -u) \
                     <(nm -D --defined-only "$ckv" | awk '{print $3}' | sort -u))
  [ -z "$missing" ] && ok "every ckv function the module calls is exported by ckv" || bad "ckv does not export: $missing"
else
  echo "skip symbol check: no nm"
fi
out=$("$ckv" generate -m "$fx" --prompt-ids 1,2,3 -n 2 --backend cuda 2>&1); rc=$?
if [ $rc = 0 ]; then
  ok "--backend cuda runs here (a GPU)"
elif echo "$out" | grep -qiE 'module|undefined symbol|does not load'; then
  bad "--backend cuda did not load the module: $(echo "$out" | tail -1)"
else
  ok "--backend cuda loaded the module and stopped at the GPU: $(echo "$out" | tail -1)"
fi
out=$(CKV_GPU_MODULE=/nonexistent/libckv_cuda.so "$ckv" generate -m "$fx" --prompt-ids 1,2,3 -n 2 --backend cuda 2>&1); rc=$?
if [ $rc = 1 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "CKV_GPU_MODULE=/nonexistent"; then
  ok "a missing module: $out"
else
  bad "a missing module: exit $rc, $out"
fi
# stand-in modules (a C compiler needed): one of another interface version, one of this version that
# defines no backend (the binary's own ckv_backend_cuda_init must not be found in its place)
src=$(cd "$(dirname "$0")/../../src" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if command -v cc >/dev/null; then
  printf '#include "core/gpu_module.h"\nint ckv_gpu_module_abi(void);\nint ckv_gpu_module_abi(void) { return CKV_GPU_MODULE_ABI + %s; }\n' 0 >"$tmp/same.c"
  printf '#include "core/gpu_module.h"\nint ckv_gpu_module_abi(void);\nint ckv_gpu_module_abi(void) { return CKV_GPU_MODULE_ABI + %s; }\n' 1 >"$tmp/other.c"
  cc -shared -fPIC -I"$src" -o "$tmp/same.so" "$tmp/same.c" && cc -shared -fPIC -I"$src" -o "$tmp/other.so" "$tmp/other.c"
  out=$(CKV_GPU_MODULE=$tmp/other.so "$ckv" generate -m "$fx" --prompt-ids 1,2,3 -n 2 --backend cuda 2>&1); rc=$?
  if [ $rc = 1 ] && echo "$out" | grep -q "another interface version"; then
    ok "a module of another interface version: $out"
  else
    bad "a module of another interface version: exit $rc, $out"
  fi
  out=$(CKV_GPU_MODULE=$tmp/same.so "$ckv" generate -m "$fx" --prompt-ids 1,2,3 -n 2 --backend cuda --device 0 2>&1); rc=$?
  if [ $rc = 1 ] && echo "$out" | grep -q "defines no ckv_backend_cuda_init"; then
    ok "a module without the backend entry point: $out"
  else
    bad "a module without the backend entry point: exit $rc, $out"
  fi
else
  echo "skip stand-in modules: no C compiler"
fi
exit $fail
