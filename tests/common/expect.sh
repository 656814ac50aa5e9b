# expect.sh - the one check of a refused command that the shell tests share (sourced; tests only).
# expect_error NAME EXPECTED CMD...: runs CMD (a program, or a function the test exported with
# export -f) without stdin for at most 120 s, stdout to $tmp/out and stderr to $tmp/err. It passes
# when CMD exits 1..127 (not killed by a signal, not timed out), exactly one stderr line names an
# error and it is the last one, it holds no control bytes and contains EXPECTED; unless
# EXPECT_ERROR_LOGS=1 that line must also be all of stderr. A failure prints why and sets fail=1.
expect_error() {
  local name=$1 want=$2; shift 2
  timeout -k 5 120 bash -c '"$@"' expect_error "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  local lines errors; lines=$(wc -l <"$tmp/err"); errors=$(grep -c 'error' "$tmp/err")
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL $name: did not finish within 120 s"; fail=1
  elif [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
    echo "FAIL $name: exit status $rc (expected 1..127)"; head -c 2000 "$tmp/err"; fail=1
  elif [ "$errors" -ne 1 ] || ! tail -n 1 "$tmp/err" | grep -q 'error'; then
    echo "FAIL $name: $errors error lines on stderr, expected one, the last:"; head -c 2000 "$tmp/err"; fail=1
  elif [ "${EXPECT_ERROR_LOGS:-0}" != 1 ] && [ "$lines" -ne 1 ]; then
    echo "FAIL $name: $lines lines on stderr, expected one:"; head -c 2000 "$tmp/err"; fail=1
  elif LC_ALL=C grep -q '[[:cntrl:]]' <(tr -d '\n' <"$tmp/err"); then
    echo "FAIL $name: control bytes on stderr:"; od -c "$tmp/err" | head; fail=1
  elif ! tail -n 1 "$tmp/err" | grep -qF -- "$want"; then
    echo "FAIL $name: stderr lacks '$want':"; cat "$tmp/err"; fail=1
  else
    echo "ok   $name: $(tail -n 1 "$tmp/err" | cut -c1-200)"
  fi
}
