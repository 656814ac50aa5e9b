#!/usr/bin/env bash
# test_serve.sh - launch/slurm/ckv-serve.sbatch submitted with sbatch to a throwaway cluster
# (tests/cluster/cluster.sh: slurmctld on a head namespace, a slurmd per node namespace) as a user
# would: from a directory of their own (so the output and endpoint files land there, by the
# template's defaults), with MODEL and GRACE in the environment and the job's size on sbatch's
# command line. A client on the head node (tests/cluster/serve_client.py, standard library only)
# finds the server through the endpoint file and talks to it only at the cluster's addresses. Checks:
#   - the endpoint file appears and names a node of the cluster; /health answers ok and one short
#     /v1/completions gives a valid completion;
#   - SIGTERM to the batch shell alone (what the template's --signal=B:TERM@120 sends at the time
#     limit), and in a second job a plain scancel (SIGTERM to every process of the job, SIGKILL after
#     KillWait, as preemption), each while a long streaming request is in flight, drain the server:
#     the stream is ended cleanly (finish_detail "cancelled", with finish_reason "length", at the end
#     of the grace period, or "length" if it finished first, then [DONE]), the output shows the
#     template's and the server's drain lines, ckv is gone within the grace period (well before
#     KillWait's SIGKILL), the job ends COMPLETED (first case) or CANCELLED and the endpoint file
#     is removed.
#   - tensor-parallel serving: the template with 2 tasks on the 2 nodes (tp 2 on the fixture llama_gqa,
#     rank 0 answering HTTP on the first node) answers a greedy completion with a press exactly as a
#     1-task job does (text and kept KV entries), and a plain scancel drains it: the job ends, ckv is
#     gone from both nodes.
# The model is SmolLM2 (models/smollm2-135m-instruct-q4_1.gguf, CKV_SMOLLM2_GGUF overrides) when
# present, slow enough that the stream certainly outlasts the grace period; else the fixture
# llama_gqa. States come from `scontrol show job` (no accounting database here, so no sacct).
# usage: test_serve.sh CKV NODE_LOCAL_PROBE SOURCE_DIR TMP_DIR HAVE_MPI [MPIRUN]
set -u
ckv=$1; src=$3
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "the namespace cluster needs root"
"$ckv" serve --help >/dev/null 2>&1 || skip "ckv was built without \`ckv serve\` (libmicrohttpd-dev missing at configure time)"
command -v python3 >/dev/null || skip "no python3 for the client"
# shellcheck source=tests/cluster/cluster.sh
. "$src/tests/cluster/cluster.sh"
why=$(cluster_check slurm) || skip "$why"
tmp=$(mktemp -d "$4/cluster-serve.XXXXXX")
trap 'cluster_down; [ -n "${CKV_CLUSTER_KEEP:-}" ] || rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
cluster_up "$tmp" 2 slurm || { echo "FAIL: the SLURM cluster did not come up"; exit 1; }
client=(python3 "$src/tests/cluster/serve_client.py")
fail=0

smollm2=${CKV_SMOLLM2_GGUF:-$src/models/smollm2-135m-instruct-q4_1.gguf}
if [ -f "$smollm2" ]; then
  export MODEL=$smollm2 GRACE=2; name=smollm2; long=(400 1); finish_want=cancelled
else
  # the fixture generates ~500 tokens/s here: 8 choices of 1000 tokens outlast a short grace on most machines
  export MODEL=$src/tests/fixtures/models/llama_gqa GRACE=0.5; name=llama_gqa; long=(1000 8); finish_want="cancelled|length"
fi
export CKV=$ckv
serve_extra=()  # flags for ckv serve after the template
submit=$tmp/user  # the user's directory: sbatch is run there
mkdir -p "$submit"
cd "$submit" || exit 1

# submit [SBATCH_ARGS...]: sbatch the template as a user would; waits (at most 120 s) for the endpoint file
submit() {
  local start=$SECONDS
  id=$(cluster_exec head sbatch --parsable --cpus-per-task=2 --gpus-per-task=1 --time=5 "$@" \
       "$src/launch/slurm/ckv-serve.sbatch" --model-name "$name" "${serve_extra[@]}") || { echo "FAIL: sbatch refused the template"; return 1; }
  id=${id%%;*}
  out=$submit/ckv-serve-$id.out endpoint=$submit/ckv-serve-$id.endpoint
  for _ in $(seq 1 1200); do
    [ -s "$endpoint" ] && break
    case "$(cluster_job_state "$id")" in PENDING|RUNNING|CONFIGURING|"") sleep 0.1 ;; *) break ;; esac
  done
  if [ ! -s "$endpoint" ]; then
    echo "FAIL: job $id ($(cluster_job_state "$id")) wrote no endpoint file within 120 s"; cat "$out" 2>/dev/null
    cluster_exec head scancel "$id"; return 1
  fi
  node=$(cluster_job_field "$id" NodeList)
  node=$(cluster_exec head scontrol show hostnames "$node" | head -n 1)  # a multi-node job: rank 0 runs on the first node
  echo "ok   job $id on $node: endpoint $(cat "$endpoint") after $((SECONDS - start))s ($name, GRACE=$GRACE)"
  case "$(cat "$endpoint")" in "$node":[0-9]*) ;; *) echo "FAIL: the endpoint does not name the job's node $node"; return 1 ;; esac
}

# drain LABEL STATE SCANCEL_ARGS...: scancel the job with a long streaming request in flight; the
# server must drain (output lines, stream ended cleanly, ckv gone within the grace period), the job
# end in STATE and the endpoint file be removed
drain() {
  local label=$1 want=$2; shift 2
  rm -f "$tmp/streaming"
  cluster_exec head "${client[@]}" "$endpoint" "$name" stream "Once upon a time" "${long[@]}" "$tmp/streaming" >"$tmp/stream.json" &
  local client_pid=$! t0 gone="" t_end state events finish saw_done t_last err drained limit in_time first_fin
  for _ in $(seq 1 600); do [ -e "$tmp/streaming" ] && break; kill -0 "$client_pid" 2>/dev/null || break; sleep 0.1; done
  if [ ! -e "$tmp/streaming" ]; then
    echo "FAIL $label: the streaming request got no first event"; wait "$client_pid"; cat "$tmp/stream.json"
    cluster_exec head scancel "$id"; return 1
  fi
  t0=$(date +%s.%N)
  cluster_exec head scancel "$@" "$id"
  for _ in $(seq 1 300); do  # when ckv has left the node (at most 30 s)
    [ -z "$(cluster_pids_of "$node" "$ckv")" ] && { gone=$(date +%s.%N); break; }
    sleep 0.05
  done
  cluster_wait_job "$id" 30
  t_end=$(date +%s.%N)
  wait "$client_pid"
  state="$(cluster_job_state "$id") exit $(cluster_job_field "$id" ExitCode)"
  since() { awk -v a="$t0" -v b="$1" 'BEGIN { printf "%.1f", b - a }'; }
  read -r events finish saw_done t_last err < <(python3 -c '
import json, sys
g = json.load(open(sys.argv[1]))
print(g["events"], ",".join(g["finish"]) or "-", int(g["done"]), g["t_last"] or 0, (g["error"] or "-").replace(" ", "_"))' "$tmp/stream.json" 2>/dev/null)
  grep -q '^ckv serve: draining (grace' "$out" && grep -q '^ckv serve: stopped' "$out"
  drained=$?
  limit=$(awk -v g="$GRACE" 'BEGIN { print g + 3 }')  # the grace period plus the time to stop and to signal (scancel, slurmd)
  in_time=$(awk -v a="$t0" -v b="${gone:-0}" -v l="$limit" 'BEGIN { print (b > 0 && b - a <= l) ? 1 : 0 }')
  first_fin=${finish%%,*}
  if [[ "$state" =~ ^($want)$ ]] && ((drained == 0)) && [ "$in_time" = 1 ] && [ "$saw_done" = 1 ] && [ "$err" = - ] &&
     [[ "$first_fin" =~ ^($finish_want)$ ]] && [ ! -e "$endpoint" ]; then
    echo "ok   $label of job $id mid-stream: ckv exited $(since "$gone")s after it (grace ${GRACE}s), job $state after $(since "$t_end")s;" \
         "the stream ($events events) ended '$first_fin' then [DONE] at +$(since "$t_last")s; output: $(grep -E '^ckv(-serve| serve): (draining|stopped)' "$out" | paste -sd '|')"
  else
    echo "FAIL $label of job $id mid-stream: $state after $(since "$t_end")s (want $want), ckv gone at +$(since "${gone:-$t_end}")s (limit ${limit}s)," \
         "drain lines $([ $drained = 0 ] && echo present || echo missing), stream: $(cat "$tmp/stream.json"), endpoint file $([ -e "$endpoint" ] && echo left || echo removed)"
    cat "$out"; return 1
  fi
}

# (1) a client on the head node finds the server and gets a completion
submit || exit 1
cluster_exec head "${client[@]}" "$endpoint" "$name" check "Once upon a time" 8 || fail=1
# (2) SIGTERM to the batch shell alone, as the time limit's --signal=B:TERM@120 sends it: the template
# forwards it to the server's step; the job then ends on its own, COMPLETED
drain "SIGTERM to the batch shell (scancel --batch --signal=TERM)" "COMPLETED exit 0:0" --batch --signal=TERM || fail=1
# (3) a plain scancel (SIGTERM to every process of the job, SIGKILL after KillWait), as preemption
submit || exit 1
drain "scancel" "CANCELLED exit 0:[0-9]+" || fail=1

# (4) tensor-parallel serving across the two nodes equals one task (the fixture: 2 KV heads, tp 2)
if [ "${5:-OFF}" = ON ]; then
  export MODEL=$src/tests/fixtures/models/llama_gqa; name=llama_gqa
  serve_extra=(--press critical_adakv:snapkv --budget 0.3)  # budgets agreed across the ranks
  ctx='['$(seq -s, 3 2 460)']'  # 229 token ids (the vocabulary has 512): long enough for the press to compress
  ask() { cluster_exec head "${client[@]}" "$endpoint" "$name" check "$ctx" 12 "$1"; }
  submit || exit 1
  ask "$tmp/one.json" || fail=1
  cluster_exec head scancel "$id"; cluster_wait_job "$id" 30
  submit --nodes=2 --ntasks=2 --ntasks-per-node=1 || exit 1
  ask "$tmp/tp2.json" || fail=1
  if cmp -s "$tmp/one.json" "$tmp/tp2.json" && grep -q '"text"' "$tmp/one.json"; then
    echo "ok   tp 2 over 2 nodes answers as 1 task: $(cat "$tmp/tp2.json")"
  else
    echo "FAIL tp 2 over 2 nodes: $(cat "$tmp/tp2.json" 2>/dev/null) vs 1 task: $(cat "$tmp/one.json" 2>/dev/null)"; fail=1
  fi
  grep -q "2 tensor-parallel ranks" "$submit/ckv-serve-$id.out" || { echo "FAIL: the job's server is not 2 ranks"; cat "$submit/ckv-serve-$id.out"; fail=1; }
  cluster_exec head scancel "$id"; cluster_wait_job "$id" 30
  left=""
  for nd in "${CLUSTER_NODES[@]}"; do [ -n "$(cluster_pids_of "$nd" "$ckv")" ] && left="$left $nd"; done
  if [ -z "$left" ] && grep -q '^ckv serve: stopped' "$submit/ckv-serve-$id.out"; then
    echo "ok   scancel drained the tp 2 job ($(cluster_job_state "$id")); ckv gone from every node"
  else
    echo "FAIL scancel of the tp 2 job: ckv left on:${left:- none}; output:"; cat "$submit/ckv-serve-$id.out"; fail=1
  fi
else
  echo "skip tensor-parallel serving: this ckv has no MPI"
fi
exit $fail
