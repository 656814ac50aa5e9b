#!/usr/bin/env bash
# test_cli_generate.sh - drives `ckv generate` and `ckv inspect` on the fixture models: greedy ids
# equal the transformers reference, and every bad input (flags, files, configs, checkpoints) ends
# with exit status 1 or 2 and ONE line on stderr that names what is wrong — never a crash.
# usage: test_cli_generate.sh CKV_BINARY FIXTURES_DIR TMP_DIR
set -u
ckv=$1; fx=$2/models; tmp=$(mktemp -d "$3/cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
llama=$fx/llama_gqa

. "$(dirname "$0")/../common/expect.sh" # expect_error

# --- a good run: greedy ids equal the reference ---
ids=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(','.join(map(str,r['prompt_ids'])))" "$llama/reference.json")
want=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(' '.join(map(str,r['greedy_ids'])))" "$llama/reference.json")
got=$("$ckv" generate --model "$llama" --prompt-ids "$ids" --max-new-tokens 9 --ignore-eos --threads 2 --chunk 50 \
      --stats-json "$tmp/stats.json" 2>"$tmp/err")
if [ "$got" != "$want" ]; then echo "FAIL greedy ids: got '$got', expected '$want'"; cat "$tmp/err"; fail=1
else echo "ok   greedy ids match the reference: $got"; fi
python3 - "$tmp/stats.json" <<'PY' || fail=1
import json, sys
s = json.load(open(sys.argv[1]))
assert s["prefill_tokens"] == 240 and s["decode_tokens"] == 8, s
assert s["prefill_tok_s"] > 0 and s["decode_tok_s"] > 0 and s["peak_rss_bytes"] > 0 and s["kv_bytes"] > 0, s
print("ok   stats json:", s)
PY
"$ckv" inspect --model "$llama" --tp 2 --context 700 --press critical_adakv:snapkv --budget 0.25 >"$tmp/inspect" 2>&1 || { echo "FAIL inspect"; cat "$tmp/inspect"; fail=1; }
grep -q "LlamaForCausalLM" "$tmp/inspect" && grep -q "KV compressed" "$tmp/inspect" || { echo "FAIL inspect output"; cat "$tmp/inspect"; fail=1; }

# --- flags ---
expect_error "no command" "no command given" "$ckv"
expect_error "unknown command" "unknown command 'fly'" "$ckv" fly
expect_error "missing --model" "--model is required" "$ckv" generate --prompt-ids 1,2
expect_error "unknown flag" "unknown flag '--bogus'" "$ckv" generate --model "$llama" --prompt-ids 1 --bogus
expect_error "flag without value" "--max-new-tokens needs a value" "$ckv" generate --model "$llama" --prompt-ids 1 --max-new-tokens
expect_error "bad integer" "--threads: expected an integer, got 'two'" "$ckv" generate --model "$llama" --prompt-ids 1 --threads two
expect_error "zero threads" "--threads: 0 is outside" "$ckv" generate --model "$llama" --prompt-ids 1 --threads 0
expect_error "negative new tokens" "--max-new-tokens: -1 is outside" "$ckv" generate --model "$llama" --prompt-ids 1 --max-new-tokens -1
expect_error "top-p zero" "--top-p" "$ckv" generate --model "$llama" --prompt-ids 1 --top-p 0
expect_error "top-p above one" "--top-p" "$ckv" generate --model "$llama" --prompt-ids 1 --top-p 1.5
expect_error "temperature nan" "--temperature" "$ckv" generate --model "$llama" --prompt-ids 1 --temperature nan
expect_error "chunk zero" "--chunk" "$ckv" generate --model "$llama" --prompt-ids 1 --chunk 0
expect_error "bad prompt ids" "'x' at token 1" "$ckv" generate --model "$llama" --prompt-ids 1,x,3
expect_error "empty prompt" "no token ids" "$ckv" generate --model "$llama" --prompt-ids ","
expect_error "both prompt flags" "exactly one of" "$ckv" generate --model "$llama" --prompt-ids 1 --prompt-ids-file x
expect_error "missing prompt file" "nope.txt" "$ckv" generate --model "$llama" --prompt-ids-file "$tmp/nope.txt"
expect_error "token outside vocabulary" "outside the vocabulary" "$ckv" generate --model "$llama" --prompt-ids 1,99999
expect_error "unknown backend" "--backend: expected one of cpu,cuda,cuda-emu, got 'tpu'" "$ckv" generate --model "$llama" --prompt-ids 1 --backend tpu
long=$(python3 -c "print(','.join(['5']*1100))")
echo "$long" >"$tmp/long.txt"
expect_error "prompt too long" "max_position_embeddings" "$ckv" generate --model "$llama" --prompt-ids-file "$tmp/long.txt"
expect_error "prompt + new too long" "--max-new-tokens 100" "$ckv" generate --model "$llama" --prompt-ids-file <(python3 -c "print(','.join(['5']*1000))") --max-new-tokens 100

# --- presses ---
expect_error "budget above one" "budget 1.5 is outside (0, 1]" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv --budget 1.5
expect_error "budget zero" "budget 0 is outside (0, 1]" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv --budget 0
expect_error "compression ratio one" "compression_ratio 1 is outside [0, 1)" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv --compression-ratio 1
expect_error "budget tokens zero" "budget_tokens 0 must be >= 1" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv --budget-tokens 0
expect_error "unknown press" "unknown press 'nonsense'" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press nonsense --budget 0.5
expect_error "unknown wrapper" "unknown wrapper 'super'" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press super:snapkv --budget 0.5
expect_error "unknown press option" "unknown press option 'foo'" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press critical:snapkv --press-opt foo=1 --budget 0.5
expect_error "bad pool" "pool: 'median'" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv --pool median --budget 0.5
expect_error "even kernel" "kernel: 4 must be odd" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv --kernel 4 --budget 0.5
expect_error "alpha above one" "alpha: 2 is outside" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press critical:snapkv --alpha 2 --budget 0.5
expect_error "composed member order" "chunkkv: on press 2 of composed: needs" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press composed:snapkv+chunkkv:knorm --press-opt press_ratios=0.5,0.5
expect_error "composed per_layer member with a press ratio" "press_ratios has 2 values for 1 presses that take one (per_layer: members" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press composed:per_layer:snapkv+knorm --press-opt compression_ratios=0.5,0.5,0.5 --press-opt press_ratios=0.5,0.5
expect_error "composed per_layer member without ratios" "needs option compression_ratios for its per_layer: member" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press composed:snapkv+per_layer:knorm --press-opt press_ratios=0.5
expect_error "composed per_layer member, wrong depth" "compression_ratios has 2 values, the model has 3 layers" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press composed:snapkv+per_layer:knorm --press-opt compression_ratios=0.5,0.5 --press-opt press_ratios=0.5
expect_error "composed headkv member" "kvpress has no HeadKV press" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press composed:snapkv+headkv:knorm --press-opt press_ratios=0.5,0.5
expect_error "composed adakv member" "refuses AdaKVPress" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press composed:knorm+adakv:keydiff --press-opt press_ratios=0.5,0.5
expect_error "press without budget" "needs a budget" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv
# a context too short for the press stays uncompressed: same ids as the full cache, one stderr line, stats say so
"$ckv" generate --model "$llama" --prompt-ids 1,2,3,4,5 --max-new-tokens 4 >"$tmp/full5" 2>/dev/null
"$ckv" generate --model "$llama" --prompt-ids 1,2,3,4,5 --max-new-tokens 4 --press snapkv --budget 0.5 \
  --stats-json "$tmp/short.json" >"$tmp/short5" 2>"$tmp/err"
if [ $? -eq 0 ] && cmp -s "$tmp/full5" "$tmp/short5" && [ "$(grep -c 'stays uncompressed: the context is not longer than the press window' "$tmp/err")" = 1 ] &&
   python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['compressed'] is False and 'window' in s['uncompressed_reason'], s" "$tmp/short.json"
then echo "ok   short context: uncompressed, same ids as the full cache, reported once"
else echo "FAIL short context"; cat "$tmp/err" "$tmp/full5" "$tmp/short5"; fail=1; fi
"$ckv" generate --model "$llama" --prompt-ids "$ids" --max-new-tokens 4 --press knorm --budget-tokens 500 >"$tmp/keepall" 2>"$tmp/err" &&
  grep -q "the budget keeps every token" "$tmp/err" && echo "ok   a budget that keeps everything: uncompressed" ||
  { echo "FAIL budget keeps everything"; cat "$tmp/err"; fail=1; }
expect_error "headkv without profile" "profile" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press headkv:snapkv --budget 0.5
expect_error "query-aware without question" "--query-aware needs" "$ckv" generate --model "$llama" --prompt-ids "$ids" --press snapkv --budget 0.5 --query-aware
"$ckv" generate --model "$llama" --prompt-ids "$ids" --press critical_adakv:snapkv --budget 0.3 --question-ids 5,6 \
  --question-ids 7 --max-new-tokens 3 --dump-kept "$tmp/kept.jsonl" >"$tmp/ans" 2>"$tmp/err" || { echo "FAIL press run"; cat "$tmp/err"; fail=1; }
python3 - "$tmp/kept.jsonl" "$tmp/err" "$tmp/ans" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
err = open(sys.argv[2]).read(); ans = open(sys.argv[3]).read().split("\n")
assert len(rows) == 3 * 2, len(rows)                       # 3 layers x 2 KV heads
assert sum(r["n_kept"] for r in rows) == 6 * int(240 * (1 - 0.7)), [r["n_kept"] for r in rows]  # adakv: sum = Hkv * n_kept per layer
for r in rows:
    p = r["positions"]; assert p == sorted(set(p)) and len(p) == r["n_kept"] and all(0 <= x < 240 for x in p)
assert "critical_adakv(alpha=0.5,eps=0.0001,safeguard=0.2):snapkv(window=64,kernel=5,pool=avg) budget=0.3" in err, err
assert "% of entries kept" in err and len([a for a in ans if a.strip()]) == 2, (err, ans)
print("ok   press run: spec echoed, 2 answers, kept sets sane:", [r["n_kept"] for r in rows])
PY

# --- saved compressed contexts ---
qa=(--question-ids 5,6 --question-ids 9 --max-new-tokens 5 --ignore-eos)
"$ckv" generate --model "$llama" --prompt-ids "$ids" --press critical_adakv:snapkv --budget 0.3 "${qa[@]}" \
  --save-cache "$tmp/ctx.ckv" >"$tmp/direct" 2>"$tmp/err" || { echo "FAIL save-cache run"; cat "$tmp/err"; fail=1; }
"$ckv" generate --model "$llama" --load-cache "$tmp/ctx.ckv" "${qa[@]}" >"$tmp/loaded" 2>"$tmp/err" || { echo "FAIL load-cache run"; cat "$tmp/err"; fail=1; }
if cmp -s "$tmp/direct" "$tmp/loaded" && [ -s "$tmp/loaded" ]; then echo "ok   answers from a loaded cache equal the direct run"
else echo "FAIL loaded cache answers differ:"; cat "$tmp/direct" "$tmp/loaded"; fail=1; fi
for p in cur adakv:leverage chunkkv:snapkv per_layer:knorm key_rerotation:streaming_llm key_rerotation:critical:snapkv compactor layer_defensivekv composed:snapkv+cur composed:critical:snapkv+cur composed:snapkv+critical:cur composed:chunkkv:snapkv+knorm composed:key_rerotation:snapkv+knorm composed:snapkv+per_layer:cur composed:per_layer:snapkv+knorm kvzip; do  # attention-free presses, wrappers and the model-wide selections save and load too
  budget=(--budget 0.3); [[ $p == per_layer:* ]] && budget=(--press-opt compression_ratios=0.5,0.7,0.9)
  [[ $p == composed:* ]] && budget=(--press-opt press_ratios=0.5,0.4)
  [[ $p == composed:*per_layer:* ]] && budget=(--press-opt compression_ratios=0.5,0.7,0.9 --press-opt press_ratios=0.4)
  [[ $p == kvzip ]] && budget+=(--press-opt repeat_ids=13,13,85 --press-opt repeat_next_ids=13,13,301 --press-opt suffix_ids=13
                                --press-opt chunk_size=64)
  "$ckv" generate --model "$llama" --prompt-ids "$ids" --press "$p" "${budget[@]}" "${qa[@]}" --save-cache "$tmp/p.ckv" \
    >"$tmp/p.direct" 2>"$tmp/err" && "$ckv" generate --model "$llama" --load-cache "$tmp/p.ckv" "${qa[@]}" >"$tmp/p.loaded" 2>>"$tmp/err" \
    && cmp -s "$tmp/p.direct" "$tmp/p.loaded" && [ -s "$tmp/p.loaded" ] \
    && { [[ $p != composed:*per_layer:* ]] || grep -q "compressed with composed(press_ratios=\[0.4\]):.*per_layer(compression_ratios=\[0.5,0.7,0.9\])" "$tmp/err"; } \
    && echo "ok   $p: answers from its saved cache equal the direct run" \
    || { echo "FAIL $p save/load"; cat "$tmp/err"; fail=1; }
done
# layer_defensivekv at 0.1 spends the whole budget on layer 0: the other layers keep no context row,
# and their empty heads are saved, loaded and answered from like any other
"$ckv" generate --model "$llama" --prompt-ids "$ids" --press layer_defensivekv --budget 0.1 "${qa[@]}" --save-cache "$tmp/z.ckv" \
  --dump-kept "$tmp/z.jsonl" >"$tmp/z.direct" 2>"$tmp/err" && "$ckv" generate --model "$llama" --load-cache "$tmp/z.ckv" "${qa[@]}" \
  >"$tmp/z.loaded" 2>>"$tmp/err" && cmp -s "$tmp/z.direct" "$tmp/z.loaded" && [ -s "$tmp/z.loaded" ] \
  && python3 -c "import json,sys; n=[json.loads(l)['n_kept'] for l in open(sys.argv[1])]; assert 0 in n and sum(n) == int(240*(1-0.9)*2*3), n" "$tmp/z.jsonl" \
  && echo "ok   layer_defensivekv 0.1: empty heads saved and loaded, answers equal the direct run" \
  || { echo "FAIL layer_defensivekv 0.1 save/load"; cat "$tmp/err"; fail=1; }
expect_error "cache of another model" "made with another model" "$ckv" generate --model "$fx/mistral_gqa" --load-cache "$tmp/ctx.ckv" "${qa[@]}"
cp "$tmp/ctx.ckv" "$tmp/bad.ckv"; printf '\x55' | dd of="$tmp/bad.ckv" bs=1 seek=2000 conv=notrunc 2>/dev/null
expect_error "corrupted cache" "checksum mismatch" "$ckv" generate --model "$llama" --load-cache "$tmp/bad.ckv" "${qa[@]}"
head -c 3000 "$tmp/ctx.ckv" >"$tmp/short.ckv"
expect_error "truncated cache" "truncated cache file" "$ckv" generate --model "$llama" --load-cache "$tmp/short.ckv" "${qa[@]}"
expect_error "not a cache" "not a ckv cache file" "$ckv" generate --model "$llama" --load-cache "$llama/config.json" "${qa[@]}"
expect_error "cache and prompt" "--load-cache replaces the prompt" "$ckv" generate --model "$llama" --load-cache "$tmp/ctx.ckv" --prompt-ids 1 "${qa[@]}"
expect_error "cache without question" "a context-only cache file (saved without --query-aware) needs a question to answer" \
  "$ckv" generate --model "$llama" --load-cache "$tmp/ctx.ckv"
# query-aware caches: the question is compressed with the context and stays inside the file with the
# prompt's last logits; a run that loads it answers from them, equal to the in-process query-aware run
gq=(--max-new-tokens 5 --ignore-eos)
for p in finch snapkv; do
  pq=(--prompt-ids "$ids" --question-ids 5,6,7 --query-aware --press "$p" --budget 0.5 "${gq[@]}")
  "$ckv" generate --model "$llama" "${pq[@]}" >"$tmp/qa.direct" 2>"$tmp/err" \
    && "$ckv" generate --model "$llama" "${pq[@]}" --save-cache "$tmp/qa_$p.ckv" >"$tmp/qa.saved" 2>>"$tmp/err" \
    && "$ckv" generate --model "$llama" --load-cache "$tmp/qa_$p.ckv" "${gq[@]}" >"$tmp/qa.loaded" 2>>"$tmp/err" \
    && cmp -s "$tmp/qa.direct" "$tmp/qa.loaded" && cmp -s "$tmp/qa.direct" "$tmp/qa.saved" && [ -s "$tmp/qa.loaded" ] \
    && grep -q "loaded a context of .* query-aware" "$tmp/err" \
    && echo "ok   $p --query-aware: answers from its saved cache equal the in-process run: $(cat "$tmp/qa.loaded")" \
    || { echo "FAIL $p --query-aware save/load"; cat "$tmp/err" "$tmp/qa.direct" "$tmp/qa.loaded"; fail=1; }
done
expect_error "query-aware cache with two questions" "--save-cache with --query-aware stores one question compressed with the context: give exactly one question, got 2" \
  "$ckv" generate --model "$llama" --prompt-ids "$ids" --question-ids 5,6 --question-ids 7 --query-aware --press finch --budget 0.5 \
  --save-cache "$tmp/qa2.ckv"
expect_error "question over a query-aware cache" "$tmp/qa_finch.ckv: a query-aware cache file holds its question already (compressed with the context): drop --question-ids" \
  "$ckv" generate --model "$llama" --load-cache "$tmp/qa_finch.ckv" --question-ids 5 "${gq[@]}"
qsz=$(stat -c %s "$tmp/qa_finch.ckv"); head -c $((qsz - 100)) "$tmp/qa_finch.ckv" >"$tmp/qa_short.ckv"
expect_error "query-aware cache cut in its logits" "truncated cache file (a tail of 512 values, 1948 bytes left)" \
  "$ckv" generate --model "$llama" --load-cache "$tmp/qa_short.ckv" "${gq[@]}"

# --- model directories ---
expect_error "missing model dir" "no such model file or directory" "$ckv" generate --model "$tmp/none" --prompt-ids 1
mk() { rm -rf "$tmp/m"; cp -r "$llama" "$tmp/m"; }
mk; python3 - "$tmp/m/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c["architectures"] = ["GPT2LMHeadModel"]; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "unknown architecture" "GPT2LMHeadModel" "$ckv" generate --model "$tmp/m" --prompt-ids 1
expect_error "inspect unknown architecture" "GPT2LMHeadModel" "$ckv" inspect --model "$tmp/m"
mk; echo '{"architectures": ["LlamaForCausalLM"], "hidden_size": ' >"$tmp/m/config.json"
expect_error "truncated config" "config.json" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; python3 - "$tmp/m/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c["intermediate_size"] += 8; json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "shape disagrees with config" "mlp.gate_proj.weight" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; truncate -s 5000 "$tmp/m/model.safetensors"
expect_error "truncated checkpoint" "model.safetensors" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; rm "$tmp/m/model.safetensors"
expect_error "missing checkpoint" "model.safetensors" "$ckv" generate --model "$tmp/m" --prompt-ids 1
mk; python3 - "$tmp/m/model.safetensors" <<'PY'
# drop one tensor from the header (rewrite the file without it)
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
del h["model.layers.1.self_attn.v_proj.weight"]
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
expect_error "missing tensor" "model.layers.1.self_attn.v_proj.weight" "$ckv" generate --model "$tmp/m" --prompt-ids 1

exit $fail
