#!/usr/bin/env bash
# setup.sh - installs what ckv needs to build and run its CPU and MPI tests on a Debian-family
# machine (compiler, CMake, OpenBLAS, cJSON, PCRE2, Open MPI, libmicrohttpd for `ckv serve`, Python venv;
# SLURM and munge for the cluster tests via tests/cluster/setup.sh). Packages already present are left
# alone, so a second run does nothing. OpenBLAS serves the CPU matmul only on CPUs without AVX2
# (ckv's own kernels run elsewhere); CMake's CKV_BLAS=blis takes BLIS (libblis-dev) instead. The
# optional oracle tools (torch, transformers, kvpress) are installed by tools/oracle/regen.sh, never
# here.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin libmicrohttpd-dev python3 python3-pip python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# SLURM and munge for the cluster tests (label cluster); never fails, those tests skip instead
"$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/setup.sh"
if ((${#missing[@]} == 0)); then
  echo "setup: all build dependencies present"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
