#!/usr/bin/env bash
# ckv-mpirun.sh - starts ckv on one node with mpirun, one rank per GPU (or N CPU ranks), from a job
# configuration in configs/. Every rank runs the same command; ranks split the attention heads
# (tensor parallelism, --tp) and tensor-parallel groups split the work (data parallelism).
#
#   launch/ckv-mpirun.sh [-n RANKS] [-c configs/JOB.env] [--] [extra ckv flags...]
#
# RANKS defaults to the number of GPUs (nvidia-smi -L), else 1. A config file sets MODEL, TP, PRESS,
# BUDGET, CHUNK, THREADS and PROMPT_IDS_FILE, or COMMAND=eval with TASK, LENGTH, SAMPLES, OUT (any
# may be overridden by the environment; launch/ckv-args.sh turns them into ckv's flags).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
ckv=${CKV:-$root/build/ckv}
ranks=""
config=""
while (($#)); do
  case "$1" in
    -n) ranks=$2; shift 2 ;;
    -c) config=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
if [ -n "$config" ]; then
  [ -f "$config" ] || { echo "ckv-mpirun: config '$config' not found" >&2; exit 2; }
  # shellcheck disable=SC1090
  . "$config"
fi
# shellcheck source=launch/ckv-args.sh
. "$here/ckv-args.sh"
CKV=$ckv
ckv_args "$@" || exit 2
if [ -z "$ranks" ]; then
  ranks=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
  [ "$ranks" -ge 1 ] || ranks=1
fi
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
# one rank per GPU on this node; ckv picks the GPU from the node-local rank
exec mpirun "${extra[@]}" -np "$ranks" --map-by "ppr:$ranks:node" --bind-to none \
  -x CUDA_VISIBLE_DEVICES -x OMP_NUM_THREADS "${CKV_CMD[@]}"
