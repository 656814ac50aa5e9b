#!/usr/bin/env bash
# run_fuzz_http.sh - fuzzes the HTTP request path of `ckv serve` (tests/fuzz/fuzz_http.c) for a bounded
# time from its committed seeds tests/fuzz/corpus/http (read-only; new inputs go to tests/fuzz/out/http,
# crash files to the current directory, both git-ignored). The server's sources (src/server, the JSON
# wrapper) are compiled here by clang with libFuzzer coverage, ASan and UBSan; the model, engine and
# backend come from the regular build (<repo>/build, built here if needed), uninstrumented, since the
# CPU kernels need a newer clang than some distributions ship. Exit status non-zero on a finding; 77
# without clang or without libmicrohttpd.
#   tests/fuzz/run_fuzz_http.sh [SECONDS=60] [extra libFuzzer flags]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
secs="${1:-60}"; shift || true
cc="${CLANG:-clang}"
command -v "$cc" >/dev/null || { echo "run_fuzz_http: clang not found (apt-get install clang)" >&2; exit 77; }
build="$root/build"; out="$root/tests/fuzz/out/http"; bin="$root/tests/fuzz/out/fuzz_http"
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "${JOBS:-2}" --target fuzz_http_replay >/dev/null
[ -f "$build/libckv_server.a" ] || { echo "run_fuzz_http: ckv was built without the server (libmicrohttpd-dev)" >&2; exit 77; }
mkdir -p "$out"
# the libraries and system libraries of the replay program, as CMake linked it (but the server's own)
link=$(sed -e 's/^[^ ]* //' "$build/tests/fuzz/CMakeFiles/fuzz_http_replay.dir/link.txt" | tr ' ' '\n' |
       grep -E '\.(a|so)$|^-l|^-Wl,-rpath' | grep -v libckv_server.a | sed -e "s|^lib|$build/lib|" -e "s|^\.\./\.\./lib|$build/lib|" | tr '\n' ' ')
flags=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1)
"$cc" "${flags[@]}" -std=c11 -I"$root/src" -I/usr/include/cjson -DCKV_FIXTURES="\"$root/tests/fixtures\"" \
  "$root/tests/fuzz/fuzz_http.c" "$root"/src/server/*.c "$root/src/core/json.c" -o "$bin" \
  -Wl,--start-group $link -Wl,--end-group -lstdc++ -lpthread -lm
cd "$out"
"$bin" -max_total_time="$secs" -max_len=8192 -timeout=30 -error_exitcode=1 -rss_limit_mb=4096 -print_final_stats=1 "$@" "$out" \
  "$root/tests/fuzz/corpus/http"
