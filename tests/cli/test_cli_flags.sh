#!/usr/bin/env bash
# test_cli_flags.sh - the flag table shared by every command: --flag value, --flag=value and the short
# aliases give the same run; --help is generated with meanings and defaults; every bad flag or value,
# conflicting flags and options a press does not take end before any work with ONE stderr line naming
# them (exit 1 or 2); --threads above the core count is capped with one warning.
# usage: test_cli_flags.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/flags.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
M=$fx/llama_gqa
P=$(seq -s, 1 120)

. "$(dirname "$0")/../common/expect.sh" # expect_error

# --- spellings: the same run three ways ---
"$ckv" generate --model "$M" --prompt-ids "$P" --max-new-tokens 5 --threads 1 >"$tmp/a" 2>/dev/null
"$ckv" generate --model="$M" --prompt-ids="$P" --max-new-tokens=5 --threads=1 >"$tmp/b" 2>/dev/null
"$ckv" generate -m "$M" --prompt-ids "$P" -n 5 -t 1 >"$tmp/c" 2>/dev/null
if [ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b" && cmp -s "$tmp/a" "$tmp/c"; then echo "ok   --flag value, --flag=value and -m/-n/-t agree: $(cat "$tmp/a")"
else echo "FAIL spellings differ:"; cat "$tmp/a" "$tmp/b" "$tmp/c"; fail=1; fi

# --- generated help ---
for cmd in generate eval analyze fidelity inspect tokenize; do
  if "$ckv" $cmd --help >"$tmp/help" 2>&1 && grep -q "^usage: ckv $cmd" "$tmp/help" && grep -q -- "-m, --model PATH" "$tmp/help"; then :
  else echo "FAIL $cmd --help"; cat "$tmp/help"; fail=1; fi
done
"$ckv" generate --help >"$tmp/help"
grep -q -- "--max-new-tokens N .*(default: 32)" "$tmp/help" && grep -q -- "--kv-dtype T .*(default: f32 on cpu, bf16 on cuda)" "$tmp/help" &&
  grep -q "^press:" "$tmp/help" && grep -q "^sampling:" "$tmp/help" && echo "ok   --help lists groups, meanings and defaults" ||
  { echo "FAIL generate --help content"; cat "$tmp/help"; fail=1; }

# --- bad values and conflicts, all before any work ---
expect_error "empty id item" "--prompt-ids: empty item before token 1" "$ckv" generate -m "$M" --prompt-ids 1,,2
expect_error "leading comma" "empty item before token 0" "$ckv" generate -m "$M" --prompt-ids ,1,2
expect_error "flag value on a switch" "--ignore-eos takes no value" "$ckv" generate -m "$M" --prompt-ids 1 --ignore-eos=1
expect_error "unknown short flag" "unknown flag '-z'" "$ckv" generate -m "$M" --prompt-ids 1 -z 3
expect_error "stray argument" "unexpected argument 'hello'" "$ckv" generate -m "$M" --prompt-ids 1 hello
expect_error "flag given twice" "--chunk given twice ('16' and '32')" "$ckv" generate -m "$M" --prompt-ids 1 --chunk 16 --chunk 32
expect_error "budget and ratio" "--budget and --compression-ratio both set the budget" "$ckv" generate -m "$M" --prompt-ids "$P" --press snapkv --budget 0.5 --compression-ratio 0.5
expect_error "budget and tokens" "--budget and --budget-tokens both set the budget" "$ckv" generate -m "$M" --prompt-ids "$P" --press snapkv --budget 0.5 --budget-tokens 10
expect_error "option the press does not take" "--press knorm does not take --window" "$ckv" generate -m "$M" --prompt-ids "$P" --press knorm --budget 0.5 --window 2
expect_error "press-opt the press does not take" "does not take --press-opt alpha=0.3" "$ckv" generate -m "$M" --prompt-ids "$P" --press snapkv --budget 0.5 --press-opt alpha=0.3
kz=(--press kvzip --budget 0.5 --press-opt repeat_next_ids=13 --press-opt suffix_ids=13)
expect_error "kvzip without its prompt" "press kvzip needs option repeat_ids" "$ckv" generate -m "$M" --prompt-ids "$P" "${kz[@]}"
expect_error "kvzip prompt id not a number" "press option repeat_ids: expected comma-separated token ids, got '13,x'" \
  "$ckv" generate -m "$M" --prompt-ids "$P" "${kz[@]}" --press-opt repeat_ids=13,x
expect_error "option without a press" "--press none does not take --kernel" "$ckv" generate -m "$M" --prompt-ids "$P" --kernel 3
expect_error "options in the press name" "options are not part of the press name" "$ckv" generate -m "$M" --prompt-ids "$P" --press snapkv:window=4 --budget 0.5
expect_error "press used as a wrapper" "'snapkv' is a press, not a wrapper" "$ckv" generate -m "$M" --prompt-ids "$P" --press snapkv:knorm --budget 0.5
expect_error "eval option no press takes" "none of the presses of --press knorm,tova takes --window" "$ckv" eval -m "$M" --task niah_single_1 --length 700 --press knorm,tova --budget 0.5 --window 8 --out "$tmp/e0"
expect_error "bad choice" "--kv-dtype: expected one of f32,f16,bf16, got 'int4'" "$ckv" generate -m "$M" --prompt-ids 1 --kv-dtype int4
expect_error "chat with ids" "--chat needs a text prompt" "$ckv" generate -m "$M" --prompt-ids 1 --chat
expect_error "report-only with a model" "--report-only reads DIR's results only: drop --model" "$ckv" eval -m "$M" --out "$tmp/e1" --report-only
mkdir -p "$tmp/empty"
expect_error "report-only on an empty tree" "holds no results" "$ckv" eval --out "$tmp/empty" --report-only
start=$(date +%s)
expect_error "every task checked first" "task vt cannot be generated at --length 700" "$ckv" eval -m "$M" --task niah_single_1,vt --length 700 --samples 50 --out "$tmp/e2" --threads 1
[ ! -e "$tmp/e2/run.json" ] && [ $(( $(date +%s) - start )) -le 10 ] && echo "ok   the failed task check ran nothing and wrote no run.json" ||
  { echo "FAIL the task check came late or left run.json"; ls -la "$tmp/e2"; fail=1; }
expect_error "fidelity bad option" "--press knorm does not take --window" "$ckv" fidelity -m "$M" --text-file /dev/null --press knorm --budget 0.5 --window 4

# --- more threads than cores: capped with one warning, same output ---
"$ckv" generate -m "$M" --prompt-ids "$P" -n 5 -t 4000 >"$tmp/d" 2>"$tmp/err"
if cmp -s "$tmp/a" "$tmp/d" && [ "$(grep -c 'warning: --threads 4000 is more than the' "$tmp/err")" = 1 ]; then echo "ok   --threads 4000: $(grep warning "$tmp/err")"
else echo "FAIL --threads cap"; cat "$tmp/err"; fail=1; fi
exit $fail
