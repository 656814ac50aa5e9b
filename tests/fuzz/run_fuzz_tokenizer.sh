#!/usr/bin/env bash
# run_fuzz_tokenizer.sh - builds the tokenizer.json fuzz target with clang (libFuzzer + ASan + UBSan)
# in <repo>/build-fuzz-tok and fuzzes for a bounded time from the committed seed corpus
# tests/fuzz/corpus/tokenizer_json (read-only); new inputs and crash files go to tests/fuzz/out/
# (git-ignored). Exit status non-zero when a crash, leak or sanitizer report was found.
#   tests/fuzz/run_fuzz_tokenizer.sh [SECONDS=60] [extra libFuzzer flags]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
secs="${1:-60}"; shift || true
cc="${CLANG:-clang}"
command -v "$cc" >/dev/null || { echo "run_fuzz_tokenizer: clang not found (apt-get install clang)" >&2; exit 77; }
build="$root/build-fuzz-tok"; out="$root/tests/fuzz/out/tokenizer_json"
mkdir -p "$build" "$out"
flags=(-std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/src")
"$cc" "${flags[@]}" "$root/tests/fuzz/fuzz_tokenizer_json.c" "$root"/src/tokenizer/*.c "$root"/src/core/*.c \
  -o "$build/fuzz_tokenizer_json" -lpcre2-8 -lutf8proc -lcjson -lm -lpthread
cd "$out"
"$build/fuzz_tokenizer_json" -max_total_time="$secs" -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
  -dict="$root/tests/fuzz/tokenizer_json.dict" -print_final_stats=1 "$@" "$out" "$root/tests/fuzz/corpus/tokenizer_json"
