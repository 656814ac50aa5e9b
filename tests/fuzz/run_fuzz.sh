#!/usr/bin/env bash
# run_fuzz.sh - builds one libFuzzer target with clang (CMake, -DCKV_FUZZ=ON, in <repo>/build-fuzz) and
# fuzzes it for a bounded time from its committed seed corpus tests/fuzz/corpus/<name> (read-only);
# new inputs go to tests/fuzz/out/<name>, crash files to the current directory (both git-ignored).
# Exit status non-zero when a crash, leak, timeout or sanitizer report was found; 77 without clang.
#   tests/fuzz/run_fuzz.sh safetensors|config|dataset|kv_file|gguf [SECONDS=60] [extra libFuzzer flags]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
name="${1:?usage: run_fuzz.sh TARGET [SECONDS] [libFuzzer flags]}"; shift
secs="${1:-60}"; shift || true
cc="${CLANG:-clang}"
command -v "$cc" >/dev/null || { echo "run_fuzz: clang not found (apt-get install clang)" >&2; exit 77; }
build="$root/build-fuzz"; out="$root/tests/fuzz/out/$name"
mkdir -p "$out"
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC="$cc" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCKV_FUZZ=ON -DCKV_CUDA=OFF -DCKV_MPI=OFF \
    -DCKV_NATIVE=OFF >/dev/null
fi
cmake --build "$build" -j "${JOBS:-2}" --target "fuzz_$name" >/dev/null
dict=()
[ -f "$root/tests/fuzz/$name.dict" ] && dict=(-dict="$root/tests/fuzz/$name.dict")
cd "$out"
"$build/tests/fuzz/fuzz_$name" -max_total_time="$secs" -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
  -print_final_stats=1 "${dict[@]}" "$@" "$out" "$root/tests/fuzz/corpus/$name"
