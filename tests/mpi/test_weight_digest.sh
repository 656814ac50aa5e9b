#!/usr/bin/env bash
# test_weight_digest.sh - ranks of a tensor-parallel job that read different weight bytes must not
# answer silently: an MPMD mpirun where rank 1 reads a copy of the model with one byte changed inside
# its own slice of o_proj ends on every rank within 10 s, with one line naming the file and the rank.
# By default (--verify-weights sample) the ends of each rank's slice are sampled, so a byte there is
# caught; --verify-weights full catches a byte anywhere (here in the middle of the slice);
# --verify-weights none turns the check off (the job runs); identical copies in other directories
# pass; a changed byte in a GGUF file (SmolLM2, when present) is caught the same way.
# usage: test_weight_digest.sh CKV_BINARY FIXTURES_DIR TMP_DIR MPIRUN
set -u
ckv=$1; fx=$2; tmp=$(mktemp -d "$3/digest.XXXXXX"); mpirun=$4
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
M=$fx/models/llama_gqa
P=$(seq -s, 1 100)
run=(generate --prompt-ids "$P" --max-new-tokens 4 --threads 1 --tp 2)

# copy MODEL DIR: a copy of a model directory (weights copied, the rest linked)
copy() {
  mkdir -p "$2"
  for f in "$1"/*; do
    case $f in *.safetensors|*.gguf) cp "$f" "$2/" ;; *) ln -sf "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$2/" ;; esac
  done
}
# the byte offset in model.safetensors of element (row, col) of a 2-D tensor
offset_of() {
  python3 - "$1/model.safetensors" "$2" "$3" "$4" <<'EOF'
import json, struct, sys
path, name, row, col = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))[name]
size = {"F32": 4, "F16": 2, "BF16": 2}[t["dtype"]]
print(8 + n + t["data_offsets"][0] + (row * t["shape"][1] + col) * size)
EOF
}
flip() { # flip FILE OFFSET: one bit of one byte
  python3 - "$1" "$2" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x10]))
EOF
}
# expect NAME WANT(fail|ok) FILE RANK0_MODEL RANK1_MODEL [extra flags...]
expect() {
  local name=$1 want=$2 file=$3 m0=$4 m1=$5; shift 5
  local start; start=$(date +%s.%N)
  timeout 60 "$mpirun" --oversubscribe -np 1 "$ckv" "${run[@]}" --model "$m0" "$@" : -np 1 "$ckv" "${run[@]}" --model "$m1" "$@" \
    >"$tmp/out" 2>"$tmp/err"
  local rc=$? took; took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
  if [ "$want" = fail ]; then
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'read different model files' "$tmp/err")" = 1 ] &&
       grep -q "read different model files: .*$file.* differs on rank 1 from rank 0's" "$tmp/err" && [ ! -s "$tmp/out" ] &&
       python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 10 else 1)" "$took"; then
      echo "ok   $name: exit $rc after ${took}s: $(grep -m1 'read different' "$tmp/err")"
    else
      echo "FAIL $name: exit $rc after ${took}s, expected one line naming $file and rank 1, no tokens:"; cat "$tmp/err" "$tmp/out"; fail=1
    fi
  else
    if [ "$rc" -eq 0 ] && [ -s "$tmp/out" ] && ! grep -q "different model files" "$tmp/err"; then
      echo "ok   $name: exit 0 after ${took}s: $(head -c 80 "$tmp/out")"
    else
      echo "FAIL $name: exit $rc after ${took}s, expected the job to run:"; cat "$tmp/err"; fail=1
    fi
  fi
}

# o_proj is split by columns under tensor parallelism: rank 1 of 2 owns columns [32, 64) of every row
O=model.layers.1.self_attn.o_proj.weight
copy "$M" "$tmp/same"
expect "an identical copy in another directory" ok "" "$M" "$tmp/same"
copy "$M" "$tmp/start"; flip "$tmp/start/model.safetensors" "$(offset_of "$M" $O 0 32)"
expect "a byte at the start of rank 1's o_proj slice (default)" fail model.safetensors "$M" "$tmp/start"
copy "$M" "$tmp/end"; flip "$tmp/end/model.safetensors" "$(offset_of "$M" $O 63 63)"
expect "a byte at the end of rank 1's o_proj slice (default)" fail model.safetensors "$M" "$tmp/end"
copy "$M" "$tmp/mid"; flip "$tmp/mid/model.safetensors" "$(offset_of "$M" $O 37 45)"
expect "a byte inside rank 1's o_proj slice (--verify-weights full)" fail model.safetensors "$M" "$tmp/mid" --verify-weights full
expect "the same byte with --verify-weights none: the check is off" ok "" "$M" "$tmp/mid" --verify-weights none
# rows split: rank 1 owns the second half of q_proj's rows
copy "$M" "$tmp/q"; flip "$tmp/q/model.safetensors" "$(offset_of "$M" model.layers.2.self_attn.q_proj.weight 32 0)"
expect "a byte at the start of rank 1's q_proj rows (default)" fail model.safetensors "$M" "$tmp/q"
# a byte of the header (the tensor table's metadata: "pt" -> "pd"), the same size
copy "$M" "$tmp/hdr"; flip "$tmp/hdr/model.safetensors" "$(python3 -c "import sys; print(open(sys.argv[1], 'rb').read(4096).index(b'\"pt\"') + 2)" "$M/model.safetensors")"
expect "a byte of the safetensors header (default)" fail model.safetensors "$M" "$tmp/hdr"

# GGUF: the same check over a GGUF file's tensor data (the real model, when present)
G=$(cd "$fx/../.." && pwd)/models/smollm2-135m-instruct-q4_1.gguf
if [ -f "$G" ]; then
  cp "$G" "$tmp/bad.gguf"
  off=$(python3 - "$G" <<'EOF'
import struct, sys
# the data offset of blk.0.attn_output.weight, from the GGUF tensor table
f = open(sys.argv[1], "rb"); b = f.read(64 << 20)
p = 8; ver = struct.unpack_from("<I", b, 4)[0]; nt, nkv = struct.unpack_from("<QQ", b, p); p += 16
def s(p): n = struct.unpack_from("<Q", b, p)[0]; return b[p + 8:p + 8 + n].decode(), p + 8 + n
size = {0: 4, 1: 4, 2: 4, 3: 4, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8, 13: 8}
def val(t, p):
    if t == 8: return s(p)[1]
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, p); p += 12
        for _ in range(n): p = val(et, p)
        return p
    return p + {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[t]
align = 32
for _ in range(nkv):
    k, p = s(p); t = struct.unpack_from("<I", b, p)[0]; p += 4
    if k == "general.alignment": align = struct.unpack_from("<I", b, p)[0]
    p = val(t, p)
want = None
for _ in range(nt):
    name, p = s(p); nd = struct.unpack_from("<I", b, p)[0]; p += 4; ne = struct.unpack_from(f"<{nd}Q", b, p); p += 8 * nd
    t, off = struct.unpack_from("<IQ", b, p); p += 12
    if name == "blk.0.attn_output.weight": want = off
data = (p + align - 1) // align * align
print(data + want + 200)  # row 0 of o_proj (360 bytes of Q4_1 blocks): rank 1's columns start at byte 180
EOF
)
  flip "$tmp/bad.gguf" "$off"
  expect "a byte in a GGUF file's o_proj (default)" fail "$(basename "$G")" "$G" "$tmp/bad.gguf"
else
  echo "SKIP the GGUF case: $G is absent (tools/models/fetch_smollm2.sh fetches it)"
fi
exit $fail
