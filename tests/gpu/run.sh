#!/usr/bin/env bash
# run.sh - the one prepared script for a bare machine with NVIDIA GPUs (CUDA toolkit with NCCL, CMake,
# ninja, python3 with torch and transformers; no package registry): unpacks the Debian packages that
# tools/gpu/prepare.sh downloaded on the development machine (build-deps/debs, copied along with the
# tree) into a private prefix with dpkg -x, configures and builds ckv with the CUDA backend against
# it, then runs the CUDA tests (label cuda), the tensor-parallel tests on the GPU (2 ranks x tp 2 on
# one GPU through the staged path equal tp 1; NCCL across GPUs when there are several; a stalled
# rank ends the job within the timeout), the kernel microbenchmarks beside their torch peers
# (tools/bench/bench_kernels_peer.py), one short end-to-end run's per-op profile (CKV_CUDA_SYNC=2)
# and the benchmark (tools/bench/bench_gpu.py), in at most
# 8 minutes, and prints a summary table last. Nothing is installed; apt-get is never called.
#   tests/gpu/run.sh [--dry-run] [OUT_DIR]     (OUT_DIR: $OUT, else build-gpu/results)
#   tests/gpu/run.sh --rehearse BUILD_DIR [OUT_DIR]
# --dry-run runs every step up to the first GPU call (unpack, configure, build, the benchmark's
# dry run) and stops. --rehearse (CI: test gpu_run_rehearsal) runs every step after the build on an
# existing build without a GPU: the same commands with the CUDA backend's CPU execution layer in
# place of the GPU (--backend cuda-emu, comm_ranks `emu`), the microbenchmarks and the benchmark on
# small shapes (bench_kernels_peer.py and bench_gpu.py --rehearse), after checking that tools/gpu/prepare.sh resolves its package list.
# Exits non-zero if a step failed.
set -uo pipefail
dry=0 rehearse=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
if [ "${1:-}" = "--rehearse" ]; then
  rehearse=1; build=$(cd "${2:?--rehearse needs the build directory}" && pwd) || exit 1; shift 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-${OUT:-$root/build-gpu/results}}
mkdir -p "$out"
t_start=$(date +%s)
budget=${CKV_GPU_BUDGET_S:-480} # the whole run, seconds
left() { echo $(( budget - ($(date +%s) - t_start) )); }
: >"$out/summary.txt"
log() { echo "$*" | tee -a "$out/summary.txt"; }
declare -a rows=()
logof() { echo "$out/$(echo "$1" | tr -c 'A-Za-z0-9\n' '_').log"; } # the log file of a step
status=0
# step NAME SECONDS CMD...: runs CMD bounded by min(SECONDS, time left), records a summary row
step() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -le 5 ]; then rows+=("$(printf '%-34s %-8s %6s  %s' "$name" skipped - "out of time")"); status=1; return 1; fi
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" >"$(logof "$name")" 2>&1
  local rc=$? took=$(( $(date +%s) - t0 ))
  local what=ok; [ $rc -ne 0 ] && { what=FAIL; status=1; }
  [ $rc -eq 124 ] && what=TIMEOUT
  rows+=("$(printf '%-34s %-8s %5ss  %s' "$name" "$what" "$took" "$(tail -1 "$(logof "$name")" | cut -c1-90)")")
  return $rc
}

dev=cuda # what comm_ranks and the timeout test run on; a rehearsal: the CPU execution layer
if [ $rehearse -eq 1 ]; then
  dev=emu
  mpirun=${CKV_MPIRUN:-$(command -v mpirun || true)}
  [ -x "$build/ckv" ] || { log "--rehearse: $build/ckv is missing (build first)"; exit 1; }
  [ -n "$mpirun" ] || { log "--rehearse: no MPI launcher (mpirun, or CKV_MPIRUN)"; exit 1; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  log "== rehearsal of the GPU run on $build: --backend cuda-emu, small shapes"
  if command -v apt-cache >/dev/null; then
    step "prepare.sh --list" 120 bash -c "n=\$(bash '$root/tools/gpu/prepare.sh' --list | grep -c .) && [ \"\$n\" -gt 0 ] && echo \"\$n packages to download\""
  fi
fi
# ---- private prefix from the downloaded packages ----
debs=$root/build-deps/debs
if [ $rehearse -eq 0 ]; then
prefix=$root/build-gpu/prefix
if ! ls "$debs"/*.deb >/dev/null 2>&1; then
  log "no packages in build-deps/debs: run tools/gpu/prepare.sh on the development machine first"; exit 1
fi
command -v dpkg >/dev/null || { log "dpkg is needed to unpack build-deps/debs (dpkg -x)"; exit 1; }
if [ ! -f "$prefix/.unpacked" ] || [ "$debs/MANIFEST" -nt "$prefix/.unpacked" ]; then
  rm -rf "$prefix"; mkdir -p "$prefix"
  for d in "$debs"/*.deb; do dpkg -x "$d" "$prefix" || { log "dpkg -x $d failed"; exit 1; }; done
  # a library built for a newer C library than this machine's: use the system's copy when there is
  # one, else stop with the reason (prepare.sh should then run on a machine of this distribution)
  host_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [ -n "$host_glibc" ] && command -v objdump >/dev/null; then
    while IFS= read -r so; do
      need=$(objdump -T "$so" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1 | sed 's/GLIBC_//')
      [ -z "$need" ] && continue
      if [ "$(printf '%s\n%s\n' "$need" "$host_glibc" | sort -V | tail -1)" != "$host_glibc" ]; then
        base=$(basename "$so")
        if ldconfig -p 2>/dev/null | grep -q " ${base%%.so*}.so"; then
          log "note: $base needs glibc $need (here $host_glibc): using the system's copy"; rm -f "$prefix"/usr/lib/*/"${base%%.so*}".so*
        else
          log "$base from build-deps needs glibc $need but this machine has $host_glibc and no copy of its own:"
          log "run tools/gpu/prepare.sh on a machine of the GPU machine's distribution"; exit 1
        fi
      fi
    done < <(find "$prefix" -name '*.so*' -type f)
  fi
  touch "$prefix/.unpacked"
fi
arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
lib=$prefix/usr/lib/$arch
ompi=$lib/openmpi
export OPAL_PREFIX=$prefix/usr             # Open MPI relocated: its components and help files live here
export PATH=$prefix/usr/bin:$PATH
export LD_LIBRARY_PATH=$lib:$ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none # no CMA inside containers/VMs
mpirun=$prefix/usr/bin/orterun                 # mpirun is a dpkg alternatives link, absent in an unpacked tree
log "== prefix $prefix: $(ls "$debs"/*.deb | wc -l) packages; $($mpirun --version 2>&1 | head -1)"

# ---- configure and build with the CUDA backend ----
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
build=$root/build-gpu/build
cmake_args=(-S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCKV_CUDA=ON -DCKV_MPI=ON
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$lib"
  -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_HEADER_DIR="$ompi/include" -DMPI_C_LIB_NAMES=mpi
  -DMPI_mpi_LIBRARY="$ompi/lib/libmpi.so" -DMPIEXEC_EXECUTABLE="$mpirun"
  -DCMAKE_BUILD_RPATH="$lib;$ompi/lib"
  -DCKV_WERROR=OFF) # the GPU machine's compiler may warn where CI's does not: its warnings stay in build.log
if ! step "configure (CUDA on)" 120 cmake "${cmake_args[@]}"; then
  log "configure failed:"; tail -15 "$(logof "configure (CUDA on)")"; exit 1
fi
grep "ckv:" "$(logof "configure (CUDA on)")" | tee -a "$out/summary.txt"
grep -q "CUDA ON" "$(logof "configure (CUDA on)")" || log "note: the CUDA backend is not in this tree (src/backend/cuda/cuda_backend.cu): GPU steps test NCCL/staged only"
if ! step "build" 300 cmake --build "$build" -j "$(nproc)"; then
  log "build failed:"; grep -m5 -E "error|Error" "$(logof build)"; exit 1
fi
log "ckv links: $(ldd "$build/ckv" | grep -E 'libmpi|libcjson|libpcre2|libnccl|libcudart' | awk '{print $1 "->" $3}' | tr '\n' ' ')"
fi # rehearse -eq 0
if [ $dry -eq 1 ]; then
  step "kernel microbenchmarks (list)" 30 "$build/bench_kernels" --list --shapes full
  step "benchmark (dry run)" 60 python3 "$root/tools/bench/bench_gpu.py" --dry-run --ckv "$build/ckv" --out "$out/bench"
  cat "$(logof "benchmark (dry run)")"
  log "== dry run: stopping before the first GPU call"
  printf '%-34s %-8s %6s  %s\n' step result time "last line"; printf '%s\n' "${rows[@]}"
  exit $status
fi

# ---- on the GPU ----
log "== device"
if [ $rehearse -eq 1 ]; then
  log "none: a rehearsal on the CPU execution layer"; ngpu=0
else
  (nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv 2>&1 || echo "nvidia-smi not available") | tee -a "$out/summary.txt"
  ngpu=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
fi
# the label exactly: `-L cuda` would also match cuda-emu, the kernels on the CPU (the slow ones too)
step "ctest -L cuda" 150 ctest --test-dir "$build" -L '^cuda$' --output-on-failure
ranks=$build/tests/comm_ranks
fx=$root/tests/fixtures/random/tiny_qwen2
step "tp 2 x 1 GPU (staged) = tp 1" 60 env CUDA_VISIBLE_DEVICES=0 "$mpirun" --oversubscribe -np 2 "$ranks" tp "$fx" $dev
grep -h "logits vs tp 1" "$(logof "tp 2 x 1 GPU (staged) = tp 1")" | head -2 | tee -a "$out/summary.txt"
step "stalled rank, 1 GPU (staged)" 40 env CUDA_VISIBLE_DEVICES=0 bash "$root/tests/mpi/test_comm_timeout.sh" "$ranks" \
  "$root/tests/fixtures" "$out" "$mpirun" $dev 2
if [ "${ngpu:-0}" -ge 2 ]; then
  step "tp $ngpu x $ngpu GPUs (NCCL) = tp 1" 60 "$mpirun" --oversubscribe -np "$ngpu" "$ranks" tp "$fx" cuda
  step "stalled rank, $ngpu GPUs (NCCL)" 40 bash "$root/tests/mpi/test_comm_timeout.sh" "$ranks" "$root/tests/fixtures" \
    "$out" "$mpirun" cuda "$ngpu"
fi
step "ctest -L mpi (CPU reference)" 90 ctest --test-dir "$build" -L mpi -R 'comm_|tp_generate'
bench_mode=(); [ $rehearse -eq 1 ] && bench_mode=(--rehearse)
# each kernel beside its torch peer (tools/bench/bench_kernels_peer.py), before the whole-model benchmark
step "kernel microbenchmarks" 90 python3 "$root/tools/bench/bench_kernels_peer.py" "${bench_mode[@]}" \
  --bench "$build/bench_kernels" --out "$out/bench"
sed -n '/^== kernel microbenchmarks/,$p' "$(logof "kernel microbenchmarks")" | tee -a "$out/summary.txt"
# where one whole run's time goes (CKV_CUDA_SYNC=2: a wait after every op, per-op wall times), on a
# short context that finishes whatever the benchmark below does
prof_ctx=(--context 8192); [ $rehearse -eq 1 ] && prof_ctx=()
step "end-to-end op profile (8B, 8K)" 75 python3 "$root/tools/bench/bench_gpu.py" "${bench_mode[@]}" --ckv "$build/ckv" \
  --out "$out/profile" --profile --cases "8B@32K critical_adakv" "${prof_ctx[@]}" --new-tokens 8 --skip-hf --timeout 70
grep -A 14 "op profile" "$(logof "end-to-end op profile (8B, 8K)")" | head -15 | tee -a "$out/summary.txt"
step "benchmark" "$(( $(left) - 5 ))" python3 "$root/tools/bench/bench_gpu.py" "${bench_mode[@]}" --ckv "$build/ckv" \
  --out "$out/bench" --timeout 200
sed -n '/^== benchmark/,$p' "$(logof benchmark)" | tee -a "$out/summary.txt"
log "== summary ($(( $(date +%s) - t_start )) s of ${budget} s)"
{ printf '%-34s %-8s %6s  %s\n' step result time "last line"; printf '%s\n' "${rows[@]}"; } | tee -a "$out/summary.txt"
exit $status
