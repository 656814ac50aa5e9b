#!/usr/bin/env bash
# test_tp_evict.sh - distributed eviction keeps exactly what one rank keeps: for every press (local
# ones and the cross-head ones whose budgets are agreed by exchanging scores), `ckv generate` with a
# compressed context (finch: compressed with each question) and two questions on 2 and 4 ranks (4 ranks on 2 KV heads: replica groups)
# writes the same --dump-kept file as 1 rank and answers with the same tokens. Also checks DP x TP:
# 4 ranks as 2 groups of --tp 2 share the questions and print the same answers; contexts (one of
# them query-aware) saved by 2 ranks and loaded by 2 answer like one rank. No near-tie
# tolerance: ranks compute each head's scores with one rank's code and exchange them exactly, so the
# scores are bit-identical (docs/spec-eviction.md, "Near-ties").
# usage: test_tp_evict.sh CKV_BINARY FIXTURES_DIR TMP_DIR MPIRUN
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/tpe.XXXXXX"); mpirun=$4
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { timeout 120 "$mpirun" --oversubscribe -np "$@"; }
fail=0
for model in llama_gqa qwen2_bias; do
  dir=$fx/$model
  ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$dir/reference.json")
  heads=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_attention_heads'])" "$dir/config.json")
  # per_layer: one ratio per layer, from 0.5 up
  ratios=$(python3 -c "import json,sys; n=json.load(open(sys.argv[1]))['num_hidden_layers']; print(','.join(str(0.5+0.4*i/max(1,n-1)) for i in range(n)))" "$dir/config.json")
  for press in snapkv critical:snapkv adakv:snapkv critical_adakv:snapkv tova knorm observed_attention expected_attention pyramidkv random keydiff adakv:keydiff lagkv cur adakv:cur critical:cur leverage adakv:leverage critical:leverage chunkkv:snapkv chunkkv:keydiff per_layer:snapkv key_rerotation:snapkv key_rerotation:critical:snapkv compactor adakv:compactor defensivekv layer_defensivekv composed:snapkv+knorm composed:knorm+cur composed:critical:snapkv+knorm composed:snapkv+critical:knorm composed:chunkkv:snapkv+chunkkv:keydiff composed:key_rerotation:snapkv+knorm composed:per_layer:snapkv+knorm composed:snapkv+per_layer:cur kvzip kvzip_plus finch finch_c16; do
    budget=(--compression-ratio 0.75); [[ $press == per_layer:* ]] && budget=(--press-opt "compression_ratios=$ratios")
    [[ $press == composed:* ]] && budget=(--press-opt press_ratios=0.5,0.5)
    [[ $press == composed:*per_layer:* ]] && budget=(--press-opt "compression_ratios=$ratios" --press-opt press_ratios=0.5)
    # kvzip: its replay prompts (fixture-tokenizer ids) and chunks of 100 (three chunks of the 240 ids); kvzip_plus:
    # the same with KVzip+ (each rank's o_proj columns)
    spec=$press; [[ $press == kvzip_plus ]] && spec=kvzip && budget+=(--press-opt kvzip_plus_normalization=1)
    [[ $spec == kvzip ]] && budget+=(--press-opt repeat_ids=13,13,85,104,276 --press-opt repeat_next_ids=13,13,85,301
                                     --press-opt suffix_ids=13 --press-opt chunk_size=100)
    # finch: query-aware (each question compressed with the context, its window); finch_c16: chunks of 16,
    # no normalisation, no re-rotation
    spec=${spec%_c16}; [[ $spec == finch ]] && budget+=(--query-aware)
    [[ $press == finch_c16 ]] && budget+=(--press-opt chunk_length=16 --press-opt normalize_scores=0 --press-opt rerotate_keys=0)
    common=(generate --model "$dir" --prompt-ids "$ids" --question-ids 7,8,9 --question-ids 11,12 --max-new-tokens 5
            --ignore-eos --threads 1 --chunk 48 --press "$spec" "${budget[@]}")
    tag=${press//:/-}
    "$ckv" "${common[@]}" --dump-kept "$tmp/$model.$tag.1.jsonl" >"$tmp/$model.$tag.1.out" 2>"$tmp/err" \
      || { echo "FAIL $model $press 1 rank"; cat "$tmp/err"; fail=1; continue; }
    for np in 2 4; do
      (( heads % np )) && continue
      if ! mpi "$np" "$ckv" "${common[@]}" --dump-kept "$tmp/$model.$tag.$np.jsonl" >"$tmp/$model.$tag.$np.out" 2>"$tmp/err"; then
        echo "FAIL $model $press $np ranks"; cat "$tmp/err"; fail=1; continue
      fi
      if cmp -s "$tmp/$model.$tag.1.jsonl" "$tmp/$model.$tag.$np.jsonl" && cmp -s "$tmp/$model.$tag.1.out" "$tmp/$model.$tag.$np.out"; then
        echo "ok   $model $press on $np ranks: kept sets and answers identical ($(wc -l <"$tmp/$model.$tag.$np.jsonl") heads)"
      else
        echo "FAIL $model $press on $np ranks differs from 1 rank:"; diff <(cut -c1-200 "$tmp/$model.$tag.1.jsonl") <(cut -c1-200 "$tmp/$model.$tag.$np.jsonl") | head -5
        diff "$tmp/$model.$tag.1.out" "$tmp/$model.$tag.$np.out" | head -5; fail=1
      fi
    done
  done
done
# DP x TP: 4 ranks, 2 groups of 2, four questions shared between the groups
dir=$fx/llama_gqa
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$dir/reference.json")
qs=(--question-ids 7,8,9 --question-ids 11,12 --question-ids 13 --question-ids 40,41,42,43)
"$ckv" generate --model "$dir" --prompt-ids "$ids" "${qs[@]}" --max-new-tokens 5 --ignore-eos --threads 1 \
  --press critical_adakv:snapkv --budget 0.3 >"$tmp/dp.1" 2>"$tmp/err" || { echo "FAIL dp baseline"; cat "$tmp/err"; fail=1; }
if mpi 4 "$ckv" generate --model "$dir" --prompt-ids "$ids" "${qs[@]}" --max-new-tokens 5 --ignore-eos --threads 1 \
     --press critical_adakv:snapkv --budget 0.3 --tp 2 >"$tmp/dp.4" 2>"$tmp/err" && cmp -s "$tmp/dp.1" "$tmp/dp.4"; then
  echo "ok   dp 2 x tp 2: four answers identical to one rank"
else
  echo "FAIL dp 2 x tp 2"; cat "$tmp/err"; diff "$tmp/dp.1" "$tmp/dp.4"; fail=1
fi
# a compressed context saved by 2 ranks (one shard file per rank) answers like the direct run
if mpi 2 "$ckv" generate --model "$dir" --prompt-ids "$ids" "${qs[@]}" --max-new-tokens 5 --ignore-eos --threads 1 \
     --press critical_adakv:snapkv --budget 0.3 --save-cache "$tmp/ctx.ckv" >"$tmp/save.2" 2>"$tmp/err" &&
   mpi 2 "$ckv" generate --model "$dir" --load-cache "$tmp/ctx.ckv" "${qs[@]}" --max-new-tokens 5 --ignore-eos \
     --threads 1 >"$tmp/load.2" 2>>"$tmp/err" && cmp -s "$tmp/dp.1" "$tmp/load.2" && [ -f "$tmp/ctx.ckv.rank1" ]; then
  echo "ok   tp 2 save/load of a compressed context: answers identical"
else
  echo "FAIL tp 2 save/load"; cat "$tmp/err"; fail=1
fi
# a query-aware (finch) context saved by 2 ranks: every shard holds the prompt's last logits, and the
# loaded run answers without a question like one rank's in-process run
fq=(--question-ids 7,8,9 --query-aware --press finch --budget 0.5 --max-new-tokens 5 --ignore-eos --threads 1)
if "$ckv" generate --model "$dir" --prompt-ids "$ids" "${fq[@]}" >"$tmp/qa.1" 2>"$tmp/err" &&
   mpi 2 "$ckv" generate --model "$dir" --prompt-ids "$ids" "${fq[@]}" --save-cache "$tmp/qa.ckv" >"$tmp/qa.save" 2>>"$tmp/err" &&
   mpi 2 "$ckv" generate --model "$dir" --load-cache "$tmp/qa.ckv" --max-new-tokens 5 --ignore-eos --threads 1 \
     >"$tmp/qa.2" 2>>"$tmp/err" && cmp -s "$tmp/qa.1" "$tmp/qa.2" && cmp -s "$tmp/qa.1" "$tmp/qa.save" && [ -s "$tmp/qa.2" ] &&
   [ -f "$tmp/qa.ckv.rank1" ]; then
  echo "ok   tp 2 save/load of a query-aware (finch) context: answers identical to one rank: $(cat "$tmp/qa.2")"
else
  echo "FAIL tp 2 query-aware save/load"; cat "$tmp/err"; diff "$tmp/qa.1" "$tmp/qa.2"; fail=1
fi
if mpi 3 "$ckv" generate --model "$dir" --prompt-ids 1,2 --tp 2 >/dev/null 2>"$tmp/err"; then
  echo "FAIL --tp 2 on 3 ranks was accepted"; fail=1
elif grep -q -- "--tp 2 does not divide the 3 ranks" "$tmp/err"; then echo "ok   --tp 2 on 3 ranks refused"
else echo "FAIL --tp 2 on 3 ranks: unexpected error"; cat "$tmp/err"; fail=1; fi
exit $fail
