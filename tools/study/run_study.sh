#!/usr/bin/env bash
# run_study.sh - the CriticalKV study on a small model in kvpress's leaderboard protocol, every command
# of docs/results.md in one place:
#   1. RULER at 4K (every task ckv generates: niah x 8, vt, cwe, fwe), compression ratios 0.25, 0.5,
#      0.75, 0.875 (budgets 0.75, 0.5, 0.25, 0.125), context-only compression, the presses of the
#      leaderboard plus CriticalKV's, the full cache as the reference; then query-aware compression
#      for the snapkv family. One prefill per sample serves every press x budget (engine/sweep.h).
#   2. teacher-forced KL on long natural text (ckv fidelity) at the same budgets.
#   3. per-head, budget-wise (0.025 .. 0.4) and layer-wise perturbation (ckv analyze) of snapkv vs
#      critical:snapkv and adakv:snapkv vs critical_adakv:snapkv on RULER prompts.
#   4. the same RULER sweep on SmolLM2-135M for contrast, then the plots (tools/plot_study.py).
#   0. first, each model's HeadKV profile (ckv profile-heads) for headkv:snapkv and critical_headkv:snapkv.
# The eval steps resume (a killed run continues where it was); a profile already written is kept;
# the other steps rerun.
#
# usage: run_study.sh [--scale K] [--tiny] [--out DIR] [--ckv BIN] [--model GGUF] [--contrast GGUF]
#                     [--profile HEADKV_PROFILE.json] [--threads N] [--steps LIST] [sizes]
#   --scale K   K times the samples (default 1: sized for about two hours on 2 idle cores, see
#               docs/results.md); --tiny: a short run of every step (2 tasks, 1024 tokens) that
#               proves the pipeline end to end; --profile F uses F for the headkv presses instead of
#               the profile step 0 computes.
#   --steps LIST  the steps to run, comma separated, in this order whatever the list's: profile,
#               ruler, query, fidelity, analyze, contrast, plots (default: all). Two instances with
#               different steps may share --out (fidelity and ruler wait for the profile file).
#   sizes (each overrides what --scale / --tiny set): --length T (RULER and analyze prompt tokens,
#               default 4096), --samples N (RULER samples per task,
#               context-only), --query-samples N, --contrast-samples N (0 skips that step),
#               --probes N and --probe-length T (profile), --fid-context T and --fid-continuation T
#               (fidelity), --analyze N and --analyze-length T (needle prompts analyzed);
#               --presses LIST and --budgets LIST replace the press and budget lists of the RULER,
#               contrast and fidelity steps (query-aware keeps the snapkv family that LIST holds);
#               --tasks LIST replaces the RULER task list (all 11 by default): parts of it in
#               separate --out directories run in parallel, and `ckv eval --report-only` summarises
#               their concatenated results.jsonl (each sample depends only on its task, length,
#               seed and index).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ckv=$root/build/ckv
model=$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
contrast=$root/models/smollm2-135m-instruct-q4_1.gguf
out=$root/study
scale=1; tiny=0; profile=""; threads=0; steps=all
declare -A size=()
while [ $# -gt 0 ]; do
  case $1 in
    --scale) scale=$2; shift 2 ;;
    --tiny) tiny=1; shift ;;
    --steps) steps=$2; shift 2 ;;
    --presses) size[presses]=$2; shift 2 ;;
    --budgets) size[budgets]=$2; shift 2 ;;
    --tasks) size[tasks]=$2; shift 2 ;;
    --length|--samples|--query-samples|--contrast-samples|--probes|--probe-length|--fid-context|--fid-continuation|--analyze|--analyze-length)
      case ${2-} in ''|*[!0-9]*) echo "run_study.sh: $1 must be a non-negative integer, got '${2-}'" >&2; exit 2 ;; esac
      size[${1#--}]=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --ckv) ckv=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --contrast) contrast=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "run_study.sh: unknown argument '$1' (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
done
case $scale in ''|*[!0-9]*|0) echo "run_study.sh: --scale must be a positive integer, got '$scale'" >&2; exit 2 ;; esac
for f in "$ckv" "$model"; do [ -e "$f" ] || { echo "run_study.sh: $f does not exist" >&2; exit 2; }; done
[ -z "$profile" ] || [ -f "$profile" ] || { echo "run_study.sh: --profile $profile does not exist" >&2; exit 2; }

# sizes: samples per task (context-only, query-aware, contrast model), analyzed prompts
if [ $tiny = 1 ]; then
  tasks=niah_single_1,fwe; length=1024; s_ctx=1; s_qa=1; s_smol=1; n_analyze=1; fid_ctx=384; fid_cont=64
  budgets=0.5,0.125; an_budgets=0.1,0.4; n_probes=2; probe_len=1024
else
  tasks=all; length=4096; s_ctx=$((2 * scale)); s_qa=$((1 * scale)); s_smol=$((1 * scale)); n_analyze=$((2 * scale))
  fid_ctx=4096; fid_cont=256; budgets=0.75,0.5,0.25,0.125; an_budgets=0.025,0.05,0.1,0.2,0.4
  n_probes=$((10 * scale)); probe_len=4096
fi
length=${size[length]:-$length}; an_len=$length; tasks=${size[tasks]:-$tasks}
s_ctx=${size[samples]:-$s_ctx}; s_qa=${size[query-samples]:-$s_qa}; s_smol=${size[contrast-samples]:-$s_smol}
n_probes=${size[probes]:-$n_probes}; probe_len=${size[probe-length]:-$probe_len}
fid_ctx=${size[fid-context]:-$fid_ctx}; fid_cont=${size[fid-continuation]:-$fid_cont}
n_analyze=${size[analyze]:-$n_analyze}; an_len=${size[analyze-length]:-$an_len}
[ "$s_ctx" -gt 0 ] && [ "$n_probes" -gt 0 ] || { echo "run_study.sh: --samples and --probes must be at least 1" >&2; exit 2; }
all_steps=profile,ruler,query,fidelity,analyze,contrast,plots
[ "$steps" = all ] && steps=$all_steps
for st in ${steps//,/ }; do
  case ,$all_steps, in *,$st,*) ;; *) echo "run_study.sh: --steps: unknown step '$st' (steps: $all_steps)" >&2; exit 2 ;; esac
done
want() { case ,$steps, in *,$1,*) return 0 ;; *) return 1 ;; esac; }
# waits (at most 3 hours) for a file another instance writes
await() { local i; [ "$1" = /dev/null ] && return 0; for i in $(seq 1 1080); do [ -s "$1" ] && return 0; sleep 10; done
  echo "run_study.sh: $1 did not appear (run the profile step)" >&2; exit 1; }
presses=knorm,streaming_llm,tova,snapkv,pyramidkv,adakv:expected_attention,observed_attention,adakv:snapkv
presses=$presses,critical:snapkv,critical_adakv:snapkv,defensivekv,random
presses=$presses,headkv:snapkv,critical_headkv:snapkv
qa_presses=snapkv,pyramidkv,adakv:snapkv,critical:snapkv,critical_adakv:snapkv
if [ -n "${size[presses]:-}" ]; then
  presses=${size[presses]}; q=""
  for p in ${qa_presses//,/ }; do case ,$presses, in *,$p,*) q=$q${q:+,}$p ;; esac; done
  qa_presses=${q:-$presses}
fi
budgets=${size[budgets]:-$budgets}
th=(); [ "$threads" -gt 0 ] && th=(--threads "$threads")
mkdir -p "$out"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
start=$(date +%s)

if [ -z "$profile" ]; then
  profile=$out/headkv_profile.json
  if want profile && [ ! -s "$profile" ]; then
    log "0. HeadKV profile of $(basename "$model"): $n_probes needle probes of $probe_len tokens"
    "$ckv" profile-heads --model "$model" --samples "$n_probes" --length "$probe_len" "${th[@]}" \
      --out "$profile" --probes-out "$out/headkv_probes.jsonl" 2>"$out/headkv_profile.log"
  fi
fi
prof=(--profile "$profile")
case ,$presses, in *headkv*) ;; *) prof=(); profile=/dev/null ;; esac # no headkv press: no profile needed

if want ruler; then
  await "$profile"
  log "1. RULER $length, $tasks, $s_ctx sample(s) per task, context-only: $presses x $budgets"
  "$ckv" eval --model "$model" --task "$tasks" --length "$length" --samples "$s_ctx" --press "$presses" \
    --budget "$budgets" "${prof[@]}" "${th[@]}" --progress lines --out "$out/ruler_context" >"$out/ruler_context.txt"
fi
if want query && [ "$s_qa" -gt 0 ]; then
  log "1b. query-aware: $qa_presses x $budgets, $s_qa sample(s) per task"
  "$ckv" eval --model "$model" --task "$tasks" --length "$length" --samples "$s_qa" --press "$qa_presses" \
    --budget "$budgets" --query-aware "${th[@]}" --progress lines --out "$out/ruler_query" >"$out/ruler_query.txt"
fi

if want fidelity; then
  await "$profile"
  log "2. teacher-forced KL: $fid_ctx context + $fid_cont continuation tokens of the essay ckv ships (data/haystack)"
  "$ckv" fidelity --model "$model" --text-file "$root/data/haystack/essay.txt" --context "$fid_ctx" --continuation "$fid_cont" \
    --press "$presses" --budget "$budgets" "${prof[@]}" "${th[@]}" --out "$out/fidelity.jsonl" >"$out/fidelity.txt"
fi

want analyze && log "3. perturbation on $n_analyze needle prompt(s) of $an_len tokens: budgets $an_budgets, per head and per layer"
want analyze || n_analyze=0
for k in $(seq 1 "$n_analyze"); do
  # a needle in the essay, asked for at the end, in the model's chat template (seeded, reproducible)
  python3 - "$root/data/haystack/essay.txt" "$k" "$an_len" >"$out/needle_$k.txt" <<'PY'
import random, sys
essay, k, n = open(sys.argv[1], encoding="utf-8").read(), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(k)
words = essay.split()
start = rng.randrange(0, len(words) - n)
hay = words[start:start + int(n * 0.65)]  # about 0.7 words per token: the prompt stays near n tokens
key, value = rng.choice(["harbor", "lantern", "orchid", "falcon"]), rng.randrange(1000000, 9999999)
at = rng.randrange(len(hay))
hay[at:at] = f"One of the special magic numbers for {key} is: {value}.".split()
print(" ".join(hay) + f"\n\nWhat is the special magic number for {key} mentioned in the text above? "
      f"The special magic number for {key} mentioned in the text is")
PY
  "$ckv" tokenize --model "$model" --chat <"$out/needle_$k.txt" >"$out/needle_$k.ids"
  for pair in "snapkv critical:snapkv" "adakv:snapkv critical_adakv:snapkv"; do
    set -- $pair
    tag=$(echo "$1_vs_$2_$k" | tr ':' '-')
    "$ckv" analyze --model "$model" --prompt-ids-file "$out/needle_$k.ids" --press-a "$1" --press-b "$2" \
      --budget "$an_budgets" "${th[@]}" --out "$out/analyze_$tag.jsonl" --stats-json "$out/analyze_$tag.json" \
      --layerwise "$out/layerwise_$tag.jsonl" >"$out/analyze_$tag.txt"
  done
done

if want contrast && [ "$s_smol" -gt 0 ] && [ -e "$contrast" ]; then
  log "4. contrast: the same RULER sweep on $(basename "$contrast"), $s_smol sample(s) per task"
  cprofile=$out/headkv_profile_contrast.json; cprof=()
  if [ ${#prof[@]} -gt 0 ]; then
    [ -s "$cprofile" ] || "$ckv" profile-heads --model "$contrast" --samples "$n_probes" --length "$probe_len" "${th[@]}" \
      --out "$cprofile" 2>"$out/headkv_profile_contrast.log"
    cprof=(--profile "$cprofile")
  fi
  "$ckv" eval --model "$contrast" --task "$tasks" --length "$length" --samples "$s_smol" --press "$presses" \
    --budget "$budgets" "${cprof[@]}" "${th[@]}" --progress lines --out "$out/ruler_contrast" >"$out/ruler_contrast.txt"
fi

want plots || { log "done in $(( $(date +%s) - start )) s (steps $steps); results under $out"; exit 0; }
log "plots"
first=$(ls "$out"/analyze_snapkv_vs_critical-snapkv_1.json 2>/dev/null || true)
plot=(--out "$out/plots" --eval "$out/ruler_context" --fidelity "$out/fidelity.jsonl")
[ -n "$first" ] && plot+=(--heads "${first%.json}.jsonl" --stats "$first" --layerwise "$out/layerwise_snapkv_vs_critical-snapkv_1.jsonl")
py=${PYTHON:-python3}
if "$py" -c "import matplotlib" 2>/dev/null; then "$py" "$root/tools/plot_study.py" "${plot[@]}"
else log "matplotlib is not installed: run python3 tools/plot_study.py ${plot[*]} where it is (or set PYTHON)"; fi
log "done in $(( $(date +%s) - start )) s; results under $out"
