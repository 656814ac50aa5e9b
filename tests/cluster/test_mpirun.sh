#!/usr/bin/env bash
# test_mpirun.sh - ckv over mpirun across separate "hosts": three network-namespace nodes (own
# hostname and address each, tests/cluster/cluster.sh), Open MPI's rsh launcher pointed at the
# namespaces instead of ssh, TCP only (btl tcp,self on the cluster's bridge). Checks:
#   - the node-local rank and size ckv's comm layer reports (which choose a rank's GPU) match the
#     hosts the ranks run on, for one rank per node and for several per node;
#   - `ckv generate --tp 2`, one rank on each of two nodes, equals the 1-rank run (answers and the
#     --dump-kept kept sets of a cross-head press) on every fp32 fixture model;
#   - DP 2 x TP 2 (two ranks on each of two nodes) equals the 1-rank run;
#   - SmolLM2 (9 heads, 3 KV heads: TP must divide 3) with --tp 3 on three nodes and on 2 + 1 ranks;
#   - a rank SIGKILLed on one node ends the job on every node within 10 s.
# usage: test_mpirun.sh CKV NODE_LOCAL_PROBE SOURCE_DIR TMP_DIR HAVE_MPI MPIRUN
set -u
ckv=$1; probe=$2; src=$3; have_mpi=$5; mpirun=${6:-}
fx=$src/tests/fixtures/models
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "the namespace cluster needs root"
case "$have_mpi" in ON|1|TRUE|YES|on|true) ;; *) skip "this build of ckv has no MPI" ;; esac
if [ -z "$mpirun" ] || [ ! -x "$mpirun" ]; then skip "no mpirun"; fi
# shellcheck source=tests/cluster/cluster.sh
. "$src/tests/cluster/cluster.sh"
why=$(cluster_check) || skip "$why"
tmp=$(mktemp -d "$4/cluster-mpirun.XXXXXX")
trap 'cluster_down; [ -n "${CKV_CLUSTER_KEEP:-}" ] || rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
cluster_up "$tmp" 3 || { echo "FAIL: the namespace cluster did not come up"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0

# mpirun on the head node; HOSTS is "n0:2,n1:1"-style slots
mpi_on() {
  local hosts=$1 np=$2; shift 2
  tr ',' '\n' <<<"$hosts" | sed 's/:/ slots=/' >"$tmp/hostfile"
  timeout 120 "$src/tests/cluster/cluster.sh" exec "$tmp" head "$mpirun" --hostfile "$tmp/hostfile" -np "$np" --map-by slot --bind-to none \
    --mca plm_rsh_agent "$src/tests/cluster/cluster.sh rsh $tmp" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$CLUSTER_NET.0/24" --mca oob_tcp_if_include "$CLUSTER_NET.0/24" "$@"
}

# (1) node-local rank: lines "rank R of N host H local L of S"; L must count R's predecessors on H
check_local() { # check_local HOSTS NP LABEL
  if ! mpi_on "$1" "$2" "$probe" >"$tmp/local.raw" 2>"$tmp/err"; then
    echo "FAIL node-local rank ($3): the probe failed"; cat "$tmp/err"; fail=1; return
  fi
  sort -n -k2,2 "$tmp/local.raw" >"$tmp/local"  # the ranks' lines reach mpirun in any order
  if awk -v np="$2" '{ host[$1 NR] = $6; want = seen[$6]++; if ($8 != want) bad = bad " rank " $2 " local " $8 " (want " want ")";
                       h[NR] = $6; l[NR] = $10 }
                     END { for (i = 1; i <= NR; i++) if (l[i] != seen[h[i]]) bad = bad " size " l[i] " on " h[i] " (want " seen[h[i]] ")";
                           if (NR != np) bad = bad " " NR " lines for " np " ranks"; if (bad) { print bad; exit 1 } }' "$tmp/local" >"$tmp/why"; then
    echo "ok   node-local rank ($3): $(awk '{printf "%s%s:%s/%s", (NR > 1 ? " " : ""), $6, $8, $10}' "$tmp/local")"
  else
    echo "FAIL node-local rank ($3):$(cat "$tmp/why")"; cat "$tmp/local"; fail=1
  fi
}
check_local n0:1,n1:1,n2:1 3 "one rank per node"
check_local n0:2,n1:2 4 "two ranks per node"
check_local n0:2,n1:1 3 "2 + 1 ranks"

ids_of() { python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$1/reference.json"; }

# same answers and kept sets as one rank: same_as_one LABEL HOSTS NP TP ckv-generate-args...
same_as_one() {
  local label=$1 hosts=$2 np=$3 tp=$4; shift 4
  local tag=${label//[^a-zA-Z0-9]/_}
  "$ckv" generate "$@" --dump-kept "$tmp/$tag.1.kept" >"$tmp/$tag.1.out" 2>"$tmp/err" \
    || { echo "FAIL $label: the 1-rank run failed"; cat "$tmp/err"; fail=1; return; }
  local start=$SECONDS
  if ! mpi_on "$hosts" "$np" "$ckv" generate "$@" --tp "$tp" --dump-kept "$tmp/$tag.n.kept" >"$tmp/$tag.n.out" 2>"$tmp/err"; then
    echo "FAIL $label on $hosts: exit $?"; tail -5 "$tmp/err"; fail=1; return
  fi
  if cmp -s "$tmp/$tag.1.out" "$tmp/$tag.n.out" && cmp -s "$tmp/$tag.1.kept" "$tmp/$tag.n.kept" && [ -s "$tmp/$tag.1.kept" ]; then
    echo "ok   $label on $hosts ($((SECONDS - start))s): answers and kept sets ($(wc -l <"$tmp/$tag.n.kept") heads) equal 1 rank"
  else
    echo "FAIL $label on $hosts differs from 1 rank:"
    diff "$tmp/$tag.1.out" "$tmp/$tag.n.out" | head -5
    diff <(cut -c1-160 "$tmp/$tag.1.kept") <(cut -c1-160 "$tmp/$tag.n.kept") | head -5
    fail=1
  fi
}

# (2) TP 2, one rank per node, every fp32 fixture; a cross-head press exchanges scores between ranks
for model in llama_gqa mistral_gqa qwen2_bias; do
  dir=$fx/$model
  same_as_one "$model tp 2" n0:1,n1:1 2 2 --model "$dir" --prompt-ids "$(ids_of "$dir")" --question-ids 7,8,9 \
    --question-ids 11,12 --max-new-tokens 6 --ignore-eos --threads 1 --chunk 48 --press critical_adakv:snapkv \
    --compression-ratio 0.75
done
# (3) DP 2 x TP 2: two ranks per node, the groups share four questions
dir=$fx/llama_gqa
same_as_one "llama_gqa dp 2 x tp 2" n0:2,n1:2 4 2 --model "$dir" --prompt-ids "$(ids_of "$dir")" --question-ids 7,8,9 \
  --question-ids 11,12 --question-ids 13 --question-ids 40,41,42,43 --max-new-tokens 5 --ignore-eos --threads 1 \
  --press critical_adakv:snapkv --budget 0.3
# (4) SmolLM2, the real model
smol=$src/models/smollm2-135m-instruct-q4_1.gguf
if [ -f "$smol" ]; then
  text="The lighthouse keeper counted the ships every night and wrote the numbers in a small book."
  for day in Monday:seven Tuesday:nine Wednesday:three Thursday:twelve Friday:five Saturday:eight Sunday:none; do
    text+=" On ${day%%:*} the fog was thin over the harbour, and he counted ${day#*:} ships before midnight."
  done
  for hosts in n0:1,n1:1,n2:1 n0:2,n1:1; do
    same_as_one "SmolLM2 tp 3" "$hosts" 3 3 --model "$smol" --prompt "$text" --question "How many ships on Tuesday?" \
      --max-new-tokens 8 --threads 1 --press snapkv --compression-ratio 0.5
  done
else
  echo "note: $smol not fetched (tools/models/fetch_smollm2.sh): the SmolLM2 runs are left out"
fi

# (5) SIGKILL one rank on n1 mid-run: mpirun must end, and no ckv may be left on any node, in 10 s
qs=(); for i in $(seq 1 40); do qs+=(--question-ids "$i,$((i + 1))"); done
dir=$fx/llama_gqa
mpi_on n0:1,n1:1 2 "$ckv" generate --model "$dir" --prompt-ids "$(ids_of "$dir")" "${qs[@]}" --max-new-tokens 700 \
  --ignore-eos --threads 1 >"$tmp/kill.out" 2>"$tmp/kill.err" &
job=$!
ckv_on() { cluster_pids_of "$1" "$ckv"; }
victim=$(cluster_wait_running 20 "$ckv" n1 n0)
sleep 1
if [ -n "$victim" ] && kill -0 "$job" 2>/dev/null; then
  start=$(date +%s.%N)
  kill -9 "$victim"
  left=1
  for _ in $(seq 1 100); do
    if ! kill -0 "$job" 2>/dev/null && [ -z "$(ckv_on n0)$(ckv_on n1)" ]; then left=0; break; fi
    sleep 0.1
  done
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if ((left)); then
    echo "FAIL killed rank on n1: after ${took}s mpirun is $(kill -0 "$job" 2>/dev/null && echo running || echo gone), ckv on n0: '$(ckv_on n0)'"
    kill -9 "$job" 2>/dev/null; fail=1
  else
    wait "$job"; rc=$?
    if [ "$rc" -ne 0 ]; then echo "ok   killed rank on n1: the job ended on both nodes in ${took}s, mpirun exit $rc"
    else echo "FAIL killed rank on n1: mpirun exited 0"; fail=1; fi
  fi
else
  wait "$job"; echo "FAIL killed rank: the job ended before a rank could be killed (exit $?)"; tail -5 "$tmp/kill.err"; fail=1
fi
exit $fail
