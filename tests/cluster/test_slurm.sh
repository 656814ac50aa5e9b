#!/usr/bin/env bash
# test_slurm.sh - the SLURM templates (launch/slurm/*.sbatch) submitted with sbatch to a throwaway
# cluster (tests/cluster/cluster.sh: munged, slurmctld on a head namespace, one slurmd per node
# namespace, srun --mpi=pmix), from the repository root as a user would, with the fixture configs
# (configs/fixture-*.env). Only the output file is redirected (sbatch --output) so that nothing is
# written into the source tree. Checks:
#   - ranks see the node-local rank of the node they run on (srun --mpi=pmix, 2 nodes x 2 tasks);
#   - ckv-single-node.sbatch as written (4 ranks, TP 2 from the config: DP 2 x TP 2) and
#     ckv-multi-node.sbatch on 2 nodes x 2 tasks: answers and kept sets equal the 1-rank run, job
#     COMPLETED with exit code 0;
#   - a rank that fails (a corrupt checkpoint) puts its error into the output file and the job ends
#     FAILED with a non-zero exit code; a rank SIGKILLed on the second node ends the job FAILED in 10 s;
#   - scancel (SIGTERM, then SIGKILL after KillWait) of a `ckv eval` job mid-run, then the same
#     submission again: it resumes, keeps every result line written before the cancel and ends with
#     every item exactly once.
# States come from `scontrol show job` (the cluster has no accounting database, so no sacct).
# usage: test_slurm.sh CKV NODE_LOCAL_PROBE SOURCE_DIR TMP_DIR HAVE_MPI [MPIRUN]
set -u
ckv=$1; probe=$2; src=$3; have_mpi=$5
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "the namespace cluster needs root"
case "$have_mpi" in ON|1|TRUE|YES|on|true) ;; *) skip "this build of ckv has no MPI" ;; esac
# shellcheck source=tests/cluster/cluster.sh
. "$src/tests/cluster/cluster.sh"
why=$(cluster_check slurm) || skip "$why"
tmp=$(mktemp -d "$4/cluster-slurm.XXXXXX")
trap 'cluster_down; [ -n "${CKV_CLUSTER_KEEP:-}" ] || rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
# cluster.sh gives each node 64 CPUs and 8 GPUs, as the templates ask (the machine's cores are
# shared: CPU counts are not enforced without cgroups, and the GPUs are stand-ins)
cluster_up "$tmp" 2 slurm || { echo "FAIL: the SLURM cluster did not come up"; exit 1; }
cluster_exec head srun --mpi=list 2>&1 | grep -q pmix || skip "this SLURM has no PMIx plugin (srun --mpi=list)"
cd "$src" || exit 1
export CKV=$ckv
fail=0

# job_end ID: "STATE exit CODE" of a finished job
job_end() { echo "$(cluster_job_state "$1") exit $(cluster_job_field "$1" ExitCode)"; }

# answers: the output file without the lines of the launcher, srun and ckv's statistics
answers() { grep -v -E '^(ckv( job|:)|srun:)' "$1"; }

# (1) node-local rank under srun --mpi=pmix
if id=$(cluster_sbatch_wait 60 --nodes=2 --ntasks-per-node=2 --output="$tmp/local-%j.out" \
          --wrap "srun --mpi=pmix $probe"); then
  if [ "$(cluster_job_state "$id")" = COMPLETED ] &&
     [ "$(grep -c '^rank' "$tmp/local-$id.out")" = 4 ] &&
     awk '{ want = seen[$6]++; if ($8 != want || $10 != 2) bad = 1 } END { exit bad }' "$tmp/local-$id.out"; then
    echo "ok   node-local rank under srun --mpi=pmix: $(awk '{printf "%s%s:%s/%s", (NR > 1 ? " " : ""), $6, $8, $10}' "$tmp/local-$id.out")"
  else
    echo "FAIL node-local rank under srun: $(job_end "$id")"; cat "$tmp/local-$id.out"; fail=1
  fi
else
  echo "FAIL node-local rank: the job did not end"; fail=1
fi

# (2) the templates equal the 1-rank run: template LABEL SBATCH_ARGS... -- TEMPLATE CONFIG CKV_ARGS...
template() {
  local label=$1; shift
  local sb=() tag=${label//[^a-zA-Z0-9]/_}
  while [ "$1" != -- ]; do sb+=("$1"); shift; done
  shift
  local script=$1 config=$2; shift 2
  # the 1-rank reference: the config's own flags, minus --tp
  (
    # shellcheck disable=SC1090
    . "$config"
    "$ckv" generate --model "$MODEL" --prompt-ids-file "$PROMPT_IDS_FILE" --press "$PRESS" --budget "$BUDGET" \
      --chunk "$CHUNK" --threads 1 "$@" --dump-kept "$tmp/$tag.1.kept" >"$tmp/$tag.1.out" 2>"$tmp/$tag.1.err"
  ) || { echo "FAIL $label: the 1-rank run failed"; cat "$tmp/$tag.1.err"; fail=1; return; }
  local start=$SECONDS id
  id=$(cluster_sbatch_wait 120 "${sb[@]}" --output="$tmp/$tag-%j.out" "$script" "$config" "$@" \
       --dump-kept "$tmp/$tag.n.kept") || { echo "FAIL $label: not submitted or did not end"; fail=1; return; }
  local end out=$tmp/$tag-$id.out
  end=$(job_end "$id")
  if [ "$end" = "COMPLETED exit 0:0" ] && diff <(answers "$out") "$tmp/$tag.1.out" >/dev/null &&
     cmp -s "$tmp/$tag.1.kept" "$tmp/$tag.n.kept"; then
    echo "ok   $label: job $id on $(cluster_job_field "$id" NodeList) $end in $((SECONDS - start))s; answers and kept sets ($(wc -l <"$tmp/$tag.n.kept") heads) equal 1 rank"
  else
    echo "FAIL $label: job $id $end"; diff <(answers "$out") "$tmp/$tag.1.out" | head -5
    cmp "$tmp/$tag.1.kept" "$tmp/$tag.n.kept"; tail -5 "$out"; fail=1
  fi
}
# shellcheck disable=SC2054  # commas separate token ids
gen=(--max-new-tokens 6 --ignore-eos --question-ids 7,8,9 --question-ids 11,12 --question-ids 13 --question-ids 40,41,42,43)
template "ckv-single-node.sbatch (4 ranks: dp 2 x tp 2)" -- \
  launch/slurm/ckv-single-node.sbatch configs/fixture-llama-gqa-tp2.env "${gen[@]}"
template "ckv-multi-node.sbatch (2 nodes x 2 ranks: dp 2 x tp 2)" --ntasks-per-node=2 -- \
  launch/slurm/ckv-multi-node.sbatch configs/fixture-llama-gqa-tp2.env "${gen[@]}"

# (3a) a rank that fails: a corrupt checkpoint
cp -r tests/fixtures/models/llama_gqa "$tmp/bad"; truncate -s 4000 "$tmp/bad/model.safetensors"
if id=$(MODEL=$tmp/bad cluster_sbatch_wait 60 --ntasks-per-node=2 --output="$tmp/bad-%j.out" \
          launch/slurm/ckv-multi-node.sbatch configs/fixture-llama-gqa-tp2.env --max-new-tokens 4); then
  end=$(job_end "$id")
  if [ "${end%% *}" = FAILED ] && [ "${end#*exit }" != 0:0 ] && grep -q 'ckv\[[0-9]\]: error: .*bad/model.safetensors' "$tmp/bad-$id.out"; then
    echo "ok   a failing rank: job $id $end; its output says: $(grep -m1 'ckv\[[0-9]\]: error' "$tmp/bad-$id.out")"
  else
    echo "FAIL a failing rank: job $id $end"; cat "$tmp/bad-$id.out"; fail=1
  fi
else
  echo "FAIL a failing rank: the job did not end"; fail=1
fi

# (3b) a rank SIGKILLed on n1 mid-run
qs=(); for i in $(seq 1 40); do qs+=(--question-ids "$i,$((i + 1))"); done
ckv_on() { cluster_pids_of "$1" "$ckv"; }
id=$(cluster_exec head sbatch --parsable --ntasks-per-node=1 --output="$tmp/kill-%j.out" \
     launch/slurm/ckv-multi-node.sbatch configs/fixture-llama-gqa-tp2.env "${qs[@]}" --max-new-tokens 700 --ignore-eos)
victim=$(cluster_wait_running 30 "$ckv" n1 n0)
sleep 1
if [ -n "$victim" ] && [ "$(cluster_job_state "$id")" = RUNNING ]; then
  start=$(date +%s.%N)
  kill -9 "$victim"
  cluster_wait_job "$id" 10
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  end=$(job_end "$id")
  if [ "${end%% *}" = FAILED ] && [ -z "$(ckv_on n0)$(ckv_on n1)" ]; then
    echo "ok   a rank killed on n1: job $id $end after ${took}s; output: $(grep -m1 -E 'srun: error: n1' "$tmp/kill-$id.out")"
  else
    echo "FAIL a rank killed on n1: job $id $end after ${took}s, ckv left: '$(ckv_on n0) $(ckv_on n1)'"; tail -5 "$tmp/kill-$id.out"; fail=1
    cluster_exec head scancel "$id"
  fi
else
  echo "FAIL a rank killed on n1: no rank to kill (job $id $(job_end "$id"))"; tail -5 "$tmp/kill-$id.out"; fail=1
  cluster_exec head scancel "$id"
fi

# (4) scancel during `ckv eval`, then the same submission resumes: first a plain scancel (SIGTERM to
# every rank, SIGKILL after KillWait), then a hard stop (SIGKILL straight to every rank, as the OOM killer or
# a node failure would: no warning, a result line may be cut off; the job then ends FAILED), then a last submission
# that must finish with every item exactly once
export OUT=$tmp/eval
# 40 samples (120 items of a few tens of ms each): enough work left that a stop lands mid-run on a fast,
# idle machine too (with 10 the rest of a run could finish between two polls)
export SAMPLES=40
evargs=(launch/slurm/ckv-single-node.sbatch configs/fixture-llama-gqa-eval.env --max-new-tokens 24)
total=$( (. configs/fixture-llama-gqa-eval.env; echo $((SAMPLES * ($(tr ',' '\n' <<<"$BUDGET" | wc -l) + 1)))) )
: >"$tmp/before.jsonl"
# results: OUT/results.jsonl, plus results.g<N>.jsonl, where data-parallel group N keeps its own
# results until rank 0 merges them
check_results() { # check_results [final]: "DISTINCT MISSING DUPLICATED CHANGED" of the results against before.jsonl
  local files=("$OUT/results.jsonl")
  [ "${1:-}" = final ] || files=("$OUT"/results*.jsonl)
  cat "${files[@]}" >"$tmp/now.jsonl" 2>/dev/null
  python3 - "$tmp/before.jsonl" "$tmp/now.jsonl" <<'PY'
import json, sys
def rows(path):
    out = []
    for line in open(path):
        try: out.append(json.loads(line))
        except ValueError: pass  # a line cut off by SIGKILL
    return out
key = lambda r: (r["sample"], r["question"], r["press"], r["budget"])
before, after = rows(sys.argv[1]), rows(sys.argv[2])
keys = [key(r) for r in after]
missing = [k for k in map(key, before) if k not in keys]
changed = [key(r) for r in before if key(r) in keys and after[keys.index(key(r))] != r]
print(len(set(keys)), len(missing), len(keys) - len(set(keys)), len(changed))
PY
}
for how in TERM KILL; do  # (scancel --signal=KILL is turned into a plain cancel by SLURM 22.05)
  id=$(cluster_exec head sbatch --parsable --output="$tmp/eval-%j.out" "${evargs[@]}")
  have=$(grep -c '}$' "$tmp/before.jsonl")
  for _ in $(seq 1 600); do  # until a few more results are written
    [ "$(cat "$OUT"/results*.jsonl 2>/dev/null | wc -l)" -ge $((have + 3)) ] && break
    case "$(cluster_job_state "$id")" in RUNNING|PENDING|CONFIGURING) sleep 0.1 ;; *) break ;; esac
  done
  mapfile -t victims < <(ckv_on n0)
  start=$(date +%s.%N)
  if [ "$how" = TERM ]; then cluster_exec head scancel "$id"; else kill -9 "${victims[@]}"; fi
  cluster_wait_job "$id" 30
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  end=$(job_end "$id")
  sleep 0.5
  left=$(ckv_on n0)
  read -r n_now n_missing n_dup n_changed <<<"$(check_results)"
  want=CANCELLED; [ "$how" = KILL ] && want=FAILED
  if [ "${end%% *}" != "$want" ] || [ -n "$left" ] || [ "$n_now" -le "$have" ] || [ "$n_now" -ge "$total" ] ||
     [ "$n_missing" != 0 ] || [ "$n_dup" != 0 ] || [ "$n_changed" != 0 ]; then
    echo "FAIL stop ($how) of eval job $id: $end after ${took}s; $n_now of $total results ($have before: $n_missing lost, $n_dup duplicated, $n_changed changed), ckv left: '$left'"
    tail -5 "$tmp/eval-$id.out"; fail=1; break
  fi
  resumed=$(grep -o '[0-9]* done before' "$tmp/eval-$id.out" | head -1)
  how_ended=$(grep -q 'stopping after the sample in flight' "$tmp/eval-$id.out" && echo ", ckv stopped on SIGTERM")
  echo "ok   $([ "$how" = TERM ] && echo scancel || echo "SIGKILL of every rank") of eval job $id${resumed:+ (resumed: $resumed)} at $n_now of $total results: $end in ${took}s$how_ended; nothing lost"
  cp "$tmp/now.jsonl" "$tmp/before.jsonl"
done
if ((fail == 0)); then
  have=$(grep -c '}$' "$tmp/before.jsonl")
  id=$(cluster_sbatch_wait 120 --output="$tmp/eval-%j.out" "${evargs[@]}")
  end=$(job_end "$id")
  read -r n_now n_missing n_dup n_changed <<<"$(check_results final)"
  resumed=$(grep -o '[0-9]* done before' "$tmp/eval-$id.out" | head -1)
  if [ "$end" = "COMPLETED exit 0:0" ] && [ "$n_now" = "$total" ] && [ "$n_missing" = 0 ] && [ "$n_dup" = 0 ] &&
     [ "$n_changed" = 0 ] && [ "${resumed%% *}" -ge "$have" ]; then
    echo "ok   resubmitted eval job $id: $end ($resumed), all $total items exactly once, none lost"
  else
    echo "FAIL eval resume: job $id $end, $n_now of $total items, $n_missing lost, $n_dup duplicated, $n_changed changed ($resumed)"
    tail -5 "$tmp/eval-$id.out"; fail=1
  fi
fi
exit $fail
