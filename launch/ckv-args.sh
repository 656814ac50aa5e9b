#!/usr/bin/env bash
# ckv-args.sh - turns the variables of a job configuration (configs/*.env, already sourced) into a
# ckv command line, for the launch scripts (ckv-mpirun.sh and the SLURM templates), which source
# this file and call ckv_args. It neither reads the configuration file nor starts anything.
#
#   ckv_args [extra ckv flags...]     sets the array CKV_CMD; returns 2 with a message when unusable
#
# Variables: CKV (the binary, default build/ckv), COMMAND (generate, the default, or eval), MODEL,
# TP, PRESS, BUDGET, CHUNK, THREADS; generate: PROMPT_IDS_FILE; eval: TASK, LENGTH, SAMPLES, OUT
# (OUT is where `ckv eval` keeps its results; resubmitting the same job resumes there).
ckv_args() {
  local ckv=${CKV:-build/ckv} command=${COMMAND:-generate}
  [ -x "$ckv" ] || { echo "ckv: $ckv is not built (cmake -B build && cmake --build build -j)" >&2; return 2; }
  CKV_CMD=("$ckv" "$command")
  [ -n "${MODEL:-}" ] && CKV_CMD+=(--model "$MODEL")
  case "$command" in
    generate)
      [ -n "${PROMPT_IDS_FILE:-}" ] && CKV_CMD+=(--prompt-ids-file "$PROMPT_IDS_FILE")
      [ -n "${PRESS:-}" ] && CKV_CMD+=(--press "$PRESS")
      ;;
    eval)
      [ -n "${OUT:-}" ] || { echo "ckv: COMMAND=eval needs OUT (the results directory) in the config" >&2; return 2; }
      [ -n "${TASK:-}" ] && CKV_CMD+=(--task "$TASK")
      [ -n "${LENGTH:-}" ] && CKV_CMD+=(--length "$LENGTH")
      [ -n "${SAMPLES:-}" ] && CKV_CMD+=(--samples "$SAMPLES")
      # eval sweeps the presses; `none` is its full-cache baseline, which it runs anyway
      [ -n "${PRESS:-}" ] && [ "$PRESS" != none ] && CKV_CMD+=(--press "$PRESS")
      CKV_CMD+=(--out "$OUT" --progress lines)
      ;;
    *) echo "ckv: COMMAND=$command: the launch scripts run generate or eval" >&2; return 2 ;;
  esac
  [ -n "${TP:-}" ] && CKV_CMD+=(--tp "$TP")
  [ -n "${BUDGET:-}" ] && CKV_CMD+=(--budget "$BUDGET")
  [ -n "${CHUNK:-}" ] && CKV_CMD+=(--chunk "$CHUNK")
  [ -n "${THREADS:-}" ] && CKV_CMD+=(--threads "$THREADS")
  CKV_CMD+=("$@")
  return 0
}
