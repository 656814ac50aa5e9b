#!/usr/bin/env bash
# run.sh - runs one `ckv serve` test (tests/server/test_NAME.py) with the Python of the test venv
# (.venv-test at the repository root, which tools/test.sh fills with openai and schemathesis from
# PyPI; CKV_TEST_PYTHON overrides it). Skips (exit 77) with the reason when that Python is missing.
# usage: run.sh NAME CKV_BINARY FIXTURES_DIR TMP_DIR [ARGS of the test...]
set -u
name=$1; ckv=$2; fixtures=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${CKV_TEST_PYTHON:-$repo/.venv-test/bin/python}
if [ ! -x "$py" ]; then
  echo "SKIP: no test Python at $py (tools/test.sh creates .venv-test with openai and schemathesis)"
  exit 77
fi
tmp=$(mktemp -d "$4/server_$name.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$py" "$repo/tests/server/test_$name.py" "$ckv" "$fixtures" "$tmp" "${@:5}"
