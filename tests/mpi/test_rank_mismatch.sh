#!/usr/bin/env bash
# test_rank_mismatch.sh - MPI ranks started with different arguments (MPMD launches, as a wrong job
# script would) must not crash or hang: at start-up the ranks compare hashes of the command, the
# model, every flag that shapes the work, the prompt and the press, and the job ends within 10 s
# with one line naming the first item that differs and the ranks that differ. Flags that may differ
# per rank (--threads) do not stop the job.
# usage: test_rank_mismatch.sh CKV_BINARY FIXTURES_DIR TMP_DIR MPIRUN
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/mismatch.XXXXXX"); mpirun=$4
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
M=$fx/llama_gqa
P=$(seq -s, 1 200)
base=(--prompt-ids "$P" --max-new-tokens 4 --threads 1)

# case NAME EXPECTED_ITEM -- RANK0_ARGS... -- RANK1_ARGS...
case_() {
  local name=$1 want=$2; shift 2
  local a=() b=(); shift  # the first --
  while [ "$1" != "--" ]; do a+=("$1"); shift; done; shift
  b=("$@")
  local start; start=$(date +%s.%N)
  timeout 30 "$mpirun" --oversubscribe -np 1 "$ckv" "${a[@]}" : -np 1 "$ckv" "${b[@]}" >"$tmp/out" 2>"$tmp/err"
  local rc=$? took; took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
  local line; line=$(grep -m1 "disagree on" "$tmp/err")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'disagree on' "$tmp/err")" = 1 ] &&
     grep -qF -- "disagree on $want: rank 1 differs from rank 0" "$tmp/err" &&
     python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 10 else 1)" "$took"; then
    echo "ok   $name: exit $rc after ${took}s: $line"
  else
    echo "FAIL $name: exit $rc after ${took}s, expected one line naming $want:"; cat "$tmp/err"; fail=1
  fi
}

case_ "different --chunk" "--chunk" -- generate --model "$M" "${base[@]}" --chunk 16 --tp 2 -- generate --model "$M" "${base[@]}" --chunk 512 --tp 2
case_ "different model" "the model (its config and weight file sizes)" -- generate --model "$M" "${base[@]}" -- generate --model "$fx/mistral_gqa" "${base[@]}"
echo "$P,7" >"$tmp/prompt.txt"
case_ "different prompt" "the prompt token ids" -- generate --model "$M" "${base[@]}" -- generate --model "$M" --prompt-ids-file "$tmp/prompt.txt" --max-new-tokens 4 --threads 1
case_ "different press" "the press" -- generate --model "$M" "${base[@]}" --press snapkv --budget 0.5 -- generate --model "$M" "${base[@]}" --press knorm --budget 0.5
case_ "different --max-new-tokens" "--max-new-tokens" -- generate --model "$M" --prompt-ids "$P" -n 4 -- generate --model "$M" --prompt-ids "$P" -n 5
case_ "different --seed" "--seed" -- generate --model "$M" "${base[@]}" --seed 1 -- generate --model "$M" "${base[@]}" --seed 2
case_ "different command" "the command" -- generate --model "$M" "${base[@]}" -- inspect --model "$M"
case_ "eval with another --length" "--length" -- eval --model "$M" --task niah_single_1 --length 700 --samples 1 --out "$tmp/ev" -- eval --model "$M" --task niah_single_1 --length 800 --samples 1 --out "$tmp/ev"

# per-rank flags may differ: the job runs
timeout 60 "$mpirun" --oversubscribe -np 1 "$ckv" generate --model "$M" --prompt-ids "$P" -n 4 --threads 1 : \
  -np 1 "$ckv" generate --model "$M" --prompt-ids "$P" -n 4 --threads 2 >"$tmp/out" 2>"$tmp/err" &&
  [ -s "$tmp/out" ] && echo "ok   --threads may differ per rank: $(cat "$tmp/out")" ||
  { echo "FAIL per-rank --threads stopped the job"; cat "$tmp/err"; fail=1; }
exit $fail
