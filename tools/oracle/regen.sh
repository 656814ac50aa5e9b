#!/usr/bin/env bash
# Regenerate the oracle fixtures under tests/fixtures/models/ and tests/fixtures/presses/
# (the one documented command).
#
#   tools/oracle/regen.sh
#
# Creates <repo>/.venv-oracle (python3 -m venv + pip install -r tools/oracle/requirements.txt)
# when it is missing (and re-runs the pip install after requirements.txt changed), then builds
# the tiny models, records their reference logits, checks them against an independent NumPy
# forward, and records the kvpress eviction fixtures (press_fixtures.py). Environment:
#   PYTHON               interpreter used to create the venv (default: python3)
#   CKV_ORACLE_PIP_ARGS  extra pip arguments, e.g. "--extra-index-url https://download.pytorch.org/whl/cpu"
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the tree

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-oracle"
py="$venv/bin/python"

stamp="$venv/.ckv-oracle-requirements"  # copy of the requirements last installed successfully
if [ ! -x "$py" ]; then
    echo "[regen] creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
if ! cmp -s "$here/requirements.txt" "$stamp"; then
    echo "[regen] installing tools/oracle/requirements.txt into $venv"
    # shellcheck disable=SC2086
    "$py" -m pip install ${CKV_ORACLE_PIP_ARGS:-} -r "$here/requirements.txt"
    cp "$here/requirements.txt" "$stamp"
fi

# warn (do not fail) when the venv drifted from the pinned versions: fixtures would change
"$py" - "$here/requirements.txt" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
bad = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" not in line:
        continue
    name, want = (s.strip() for s in line.split("=="))
    try:
        have = version(name)
    except PackageNotFoundError:
        have = "missing"
    if have.split("+")[0] != want:
        bad.append(f"{name} {have} (pinned {want})")
if bad:
    print("[regen] WARNING: venv differs from requirements.txt: " + ", ".join(bad), file=sys.stderr)
PYEOF

cd "$root"
"$py" "$here/make_models.py"
"$py" "$here/dump_logits.py"
"$py" "$here/numpy_forward.py"
"$py" "$here/press_fixtures.py"
# after press_fixtures.py, which rewrites the per-model press directories
"$py" "$here/defensive_fixtures.py"
"$py" "$here/composed_fixtures.py"  # kvpress ComposedPress cases, at the context press_fixtures.py recorded
"$py" "$here/decode_fixtures.py"    # decode-time compression (tests/fixtures/decode)
"$py" "$here/fixture_tokenizer.py"  # tokenizer.json of llama_gqa (ckv eval in CI)
"$py" "$here/kvzip_fixtures.py"     # kvpress KVzipPress cases (its replay prompts in that tokenizer), at the press context
"$py" "$here/finch_fixtures.py"     # kvpress FinchPress cases (context + question compressed together), at the press context
# ckv analyze's attention-concentration statistics on llama_gqa (test_analyze_stats.sh)
"$py" "$here/analyze_stats_reference.py" tests/fixtures/models/llama_gqa -o tests/fixtures/presses/analyze_stats_llama_gqa.json

echo "[regen] fixtures:"
(cd "$root/tests/fixtures/models" && du -sh -- */ MANIFEST.json)
(cd "$root/tests/fixtures/presses" && du -sh -- */)
(cd "$root/tests/fixtures/decode" && du -sh -- */)
du -sh "$root/tests/fixtures"
