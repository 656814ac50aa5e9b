#!/usr/bin/env bash
# test_qwen25_gguf.sh - ckv on the second real model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF:
# architecture qwen2 with q/k/v biases, GQA 14/2, rope theta 1e6; tensors Q4_K, Q5_0, Q6_K, Q8_0 and
# F32) from models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, with its weights computed as stored:
#  1. a chat prompt generates 24 greedy tokens that are identical with 1 and 2 threads and contain
#     the code the question asks for ("def factorial");
#  2. against llama.cpp on the same file (tests/fixtures/gguf/qwen25_llamacpp.json, recorded by
#     tools/oracle/llamacpp_fixture.py --preset qwen25): the checks and tolerances of
#     test_gguf_parity.sh, first-position top-20 logits within FIRST_TOL and greedy tokens equal up to a
#     near tie of llama.cpp's (the margin printed).
# Skips (exit 77) when the model is absent: tools/models/fetch_qwen25_coder.sh fetches it.
# usage: test_qwen25_gguf.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fixtures=$2; tmp=$(mktemp -d "$3/qwen25.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
model=${CKV_QWEN25_GGUF:-$repo/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
if [ ! -e "$model" ]; then
  echo "SKIP: $model is absent (run tools/models/fetch_qwen25_coder.sh to fetch Qwen2.5-Coder-0.5B-Instruct)"
  exit 77
fi

fail=0
for t in 1 2; do
  if ! "$ckv" generate --model "$model" --chat --prompt "Write a Python function that returns the factorial of n." \
       --max-new-tokens 24 --threads "$t" --weights-dtype auto >"$tmp/text$t" 2>"$tmp/err$t"; then
    echo "FAIL: ckv generate --threads $t failed:"; cat "$tmp/err$t"; exit 1
  fi
done
if ! cmp -s "$tmp/text1" "$tmp/text2"; then
  echo "FAIL: the greedy text differs between 1 and 2 threads:"; diff "$tmp/text1" "$tmp/text2"; fail=1
else
  echo "ok   greedy text identical with 1 and 2 threads"
fi
if ! grep -q "def factorial" "$tmp/text1"; then
  echo "FAIL: the answer lacks 'def factorial':"; cat "$tmp/text1"; fail=1
else
  echo "ok   the answer defines factorial"
fi

PARITY_MODEL=$model PARITY_FIXTURE=qwen25_llamacpp.json PARITY_FETCH=tools/models/fetch_qwen25_coder.sh \
  PARITY_MODES=${PARITY_MODES:-auto} bash "$here/test_gguf_parity.sh" "$ckv" "$fixtures" "$3" || fail=1
exit $fail
