#!/usr/bin/env bash
# setup.sh - installs what the cluster tests need on a Debian-family machine: SLURM (slurmctld,
# slurmd, the client commands; Debian 12 ships 22.05 with the PMIx plugin), munge, and the
# namespace tools (iproute2, util-linux). Never fails: without root or a package archive it says
# what is missing and the cluster tests skip with that reason. Packages already present are left
# alone. The packages' own services are not configured or used: the tests run private daemons.
set -u
pkgs=(slurmctld slurmd slurm-client munge iproute2 util-linux)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]} == 0)) && { echo "cluster setup: SLURM, munge and the namespace tools present"; exit 0; }
sudo=""
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "cluster setup: warning: need root or sudo to install ${missing[*]}; the cluster tests will skip" >&2; exit 0
  fi
  sudo=sudo
fi
echo "cluster setup: installing ${missing[*]}"
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
         "${missing[@]}" >/dev/null; }; then
  echo "cluster setup: warning: could not install ${missing[*]}; the cluster tests will skip" >&2
fi
exit 0
