#!/usr/bin/env python3
"""test_sass.py - static checks of the GPU module's machine code (SASS) for every architecture it
embeds (sm_80, sm_90): disassembles libckv_cuda.so with cuobjdump, prints per kernel its registers,
local memory, shared memory and instruction mix (whole kernel, and inside the loop that encloses all
of its tensor-core instructions: the prefill's per-tile figures), and checks them against
tests/cuda/sass_expect.txt:
  - no kernel uses local memory (LOCAL 0 and no LDL/STL: no register spills, no stack arrays);
  - every kernel's registers fit the budget of its intended occupancy (a 'budget' line per kernel);
  - 'require' lines hold (e.g. LDGSTS and LDSM in the prefill tile loop, no generic LD.E there);
  - 'gap' lines are requirements that today's kernels do not meet yet: reported with today's count
    (recorded in the file) and not failed; one that is met now fails, so that it becomes a
    'require' line and the file stays true.
It needs no GPU. Exit 0 when every check passes, 1 on a failure, 77 (skip) when the module or
cuobjdump is absent, saying which.
  test_sass.py --module build/libckv_cuda.so --expect tests/cuda/sass_expect.txt [--cuobjdump PATH]
cuobjdump is looked up as --cuobjdump, $CKV_CUOBJDUMP, next to nvcc, on PATH, then in the Python
package nvidia-cuda-cuobjdump of .venv-test (tools/test.sh installs it there); nvdisasm, which
cuobjdump -sass runs, beside it (PyPI nvidia-cuda-nvdisasm) or on PATH.
"""
import argparse
import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGS_PER_SM = 65536  # 64K 32-bit registers per SM on sm_80 and sm_90
REG_GRANULE = 8      # registers are allocated per thread in multiples of 8
MAX_REGS = 255
# columns of the instruction-mix table (a pattern matches a mnemonic and its dotted variants)
MIX = ["HMMA", "LDSM", "LDGSTS", "LDGDEPBAR", "LDG", "LDG.E.128", "LD.E", "LDS", "LDS.128", "STS", "STG", "ST.E",
       "SHFL", "BAR", "LDL", "STL"]


def find_cuobjdump(explicit):
    cands = [explicit, os.environ.get("CKV_CUOBJDUMP")]
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cands.append(os.path.join(os.path.dirname(nvcc), "cuobjdump"))
    cands.append(shutil.which("cuobjdump"))
    cands += sorted(glob.glob(os.path.join(ROOT, ".venv-test", "lib", "python3*", "site-packages", "nvidia", "cu*",
                                           "bin", "cuobjdump")))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def find_nvdisasm(cuobjdump):
    """nvdisasm, which cuobjdump -sass runs: beside cuobjdump (the PyPI packages share a bin folder), on PATH or beside nvcc."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    for c in (os.path.join(os.path.dirname(cuobjdump), "nvdisasm"), shutil.which("nvdisasm"),
              os.path.join(os.path.dirname(nvcc), "nvdisasm")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("test_sass: %s failed (exit %d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()[:300]))
    return p.stdout


def demangle(names):
    """Short kernel names: no namespace, no parameter list, no spaces, __nv_bfloat16 -> bf16."""
    filt = shutil.which("c++filt")
    out = names
    if filt and names:
        out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")[:len(names)]
    short = {}
    for mangled, d in zip(names, out):
        d = d.strip().replace("(anonymous namespace)::", "")
        depth, cut = 0, len(d)
        for i, ch in enumerate(d):  # drop the parameter list: the first '(' outside template brackets
            depth += (ch == "<") - (ch == ">")
            if ch == "(" and depth == 0:
                cut = i
                break
        d = re.sub(r"^void ", "", d[:cut])                    # a template's return type
        d = re.sub(r"^[A-Za-z_]\w*::", "", d)                # the backend's namespace
        short[mangled] = d.replace(" ", "").replace("__nv_bfloat16", "bf16")
    return short


def parse_resources(text):
    """{(arch, mangled): {REG, STACK, SHARED, LOCAL}} from cuobjdump -res-usage."""
    res, arch = {}, None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m and arch and i + 1 < len(lines):
            res[(arch, m.group(1))] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", lines[i + 1])}
    return res


def parse_sass(text):
    """{(arch, mangled): [(address, mnemonic, branch target or None)]} from cuobjdump -sass."""
    code, arch, fn = {}, None, None
    ins = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
    for line in text.splitlines():
        m = re.match(r"\s*code for (sm_\d+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            fn = (arch, m.group(1))
            code[fn] = []
            continue
        m = ins.match(line)
        if m and fn:
            target = None
            if m.group(2).startswith("BRA"):
                t = re.search(r"0x([0-9a-f]+)", m.group(3))
                target = int(t.group(1), 16) if t else None
            code[fn].append((int(m.group(1), 16), m.group(2), target))
    return code


def matches(pattern, mnemonic):
    p, m = pattern.split("."), mnemonic.split(".")
    return m[:len(p)] == p


def count(instrs, pattern):
    return sum(1 for _, mn, _ in instrs if matches(pattern, mn))


def loop_of(instrs, pattern):
    """The instructions of the smallest loop (a backward branch's range) enclosing every instruction
    that matches pattern; None when there is no such instruction or no such loop."""
    at = [a for a, mn, _ in instrs if matches(pattern, mn)]
    if not at:
        return None
    lo, hi = min(at), max(at)
    loops = [(t, a) for a, _, t in instrs if t is not None and t <= lo and a >= hi]
    if not loops:
        return None
    t, a = min(loops, key=lambda r: r[1] - r[0])
    return [x for x in instrs if t <= x[0] <= a]


def load_expect(path):
    budgets, checks, stacks = [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            kind = line[0]
            try:
                if kind == "budget" and len(line) in (4, 6):
                    b = {"glob": line[1], "threads": int(line[2]), "blocks": int(line[3]), "line": n, "today": None}
                    if len(line) == 6:
                        if line[4] != "today":
                            raise ValueError("a budget gap ends with: today REGS")
                        b["today"] = int(line[5])
                    budgets.append(b)
                elif kind == "stack" and len(line) == 3:
                    stacks.append({"glob": line[1], "bytes": int(line[2]), "line": n})
                elif kind in ("require", "gap") and len(line) in (7, 9):
                    c = {"kind": kind, "arch": line[1], "glob": line[2], "scope": line[3], "op": line[4],
                         "rel": line[5], "n": int(line[6]), "line": n, "used": False}
                    if c["rel"] not in ("==", ">=", "<="):
                        raise ValueError("relation %s" % c["rel"])
                    if kind == "gap":
                        if len(line) != 9 or line[7] != "today":
                            raise ValueError("a gap line ends with: today N")
                        c["today"] = int(line[8])
                    checks.append(c)
                else:
                    raise ValueError("unknown line")
            except ValueError as e:
                sys.exit("test_sass: %s:%d: %s (expected 'budget KERNEL THREADS BLOCKS_PER_SM [today REGS]', 'stack "
                         "KERNEL BYTES', 'require ARCH KERNEL SCOPE OPCODE REL N' or 'gap ... today N')" % (path, n, e))
    return budgets, checks, stacks


def holds(v, rel, n):
    return v == n if rel == "==" else v >= n if rel == ">=" else v <= n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", required=True)
    ap.add_argument("--expect", required=True)
    ap.add_argument("--cuobjdump")
    a = ap.parse_args()
    if not os.path.isfile(a.module):
        print("test_sass: skipped: no GPU module at %s (a build without nvcc)" % a.module)
        return 77
    tool = find_cuobjdump(a.cuobjdump)
    if not tool:
        print("test_sass: skipped: cuobjdump not found (install the PyPI package nvidia-cuda-cuobjdump into .venv-test, "
              "as tools/test.sh does, or set CKV_CUOBJDUMP)")
        return 77
    disasm = find_nvdisasm(tool)
    if not disasm:
        print("test_sass: skipped: nvdisasm not found (cuobjdump -sass runs it; install the PyPI package "
              "nvidia-cuda-nvdisasm into .venv-test, as tools/test.sh does)")
        return 77
    os.environ["PATH"] = os.path.dirname(disasm) + os.pathsep + os.environ.get("PATH", "")
    budgets, checks, stacks = load_expect(a.expect)
    res = parse_resources(run([tool, "-res-usage", a.module]))
    code = parse_sass(run([tool, "-sass", a.module]))
    if not code:
        print("test_sass: FAIL: cuobjdump printed no SASS for %s" % a.module)
        return 1
    names = demangle(sorted({fn for _, fn in code}))
    fails, gaps = [], []
    archs = sorted({arch for arch, _ in code})
    print("test_sass: %s, %s, %d kernels x %s" % (a.module, tool, len(names), " ".join(archs)))
    mix = lambda ins: " ".join("%*d" % (max(6, len(m)), count(ins, m)) for m in MIX)
    row = "%-6s %-40s %4s %4s %6s %5s  %s"
    hdr = row % ("arch", "kernel", "reg", "max", "smem", "stack", " ".join("%6s" % m for m in MIX))
    for arch in archs:
        print("\n" + hdr)
        for fn in sorted((f for f in code if f[0] == arch), key=lambda f: names[f[1]]):
            name, ins = names[fn[1]], code[fn]
            r = res.get(fn, {})
            b = next((b for b in budgets if fnmatch.fnmatchcase(name, b["glob"])), None)
            budget = None
            if b:
                budget = min(MAX_REGS, REGS_PER_SM // (b["threads"] * b["blocks"]) // REG_GRANULE * REG_GRANULE)
            print(row % (arch, name[:40], r.get("REG", "?"), budget or "-", r.get("SHARED", "?"), r.get("STACK", "?"),
                         mix(ins)))
            hot = loop_of(ins, "HMMA")
            if hot:
                print(row % ("", "  loop around its HMMA (%d instr)" % len(hot), "", "", "", "", mix(hot)))
            where = "%s %s" % (arch, name)
            spill = count(ins, "LDL") + count(ins, "STL")
            st = next((x for x in stacks if fnmatch.fnmatchcase(name, x["glob"])), None)
            allowed = st["bytes"] if st else 0
            if r.get("LOCAL", 0) or r.get("STACK", 0) > allowed or (spill and not st):
                fails.append("%s: %d bytes of local memory, %d of stack, %d LDL/STL (register spills or a local array; "
                             "%d bytes of stack allowed)" % (where, r.get("LOCAL", 0), r.get("STACK", 0), spill, allowed))
            if not b:
                fails.append("%s: no 'budget' line in %s gives its intended occupancy" % (where, a.expect))
            elif b["today"] is not None and r.get("REG", 0) <= budget:
                fails.append("%s: known gap closed (%d registers, within the budget of %d): drop 'today' from line %d" %
                             (where, r.get("REG", 0), budget, b["line"]))
            elif b["today"] is not None:
                note = "" if r.get("REG", 0) <= b["today"] else " (recorded %d: update line %d)" % (b["today"], b["line"])
                gaps.append("%s: %d registers, over the budget of %d for %d blocks of %d threads per SM%s" %
                            (where, r.get("REG", 0), budget, b["blocks"], b["threads"], note))
            elif r.get("REG", 0) > budget:
                fails.append("%s: %d registers, over the budget of %d for %d blocks of %d threads per SM (line %d)" %
                             (where, r["REG"], budget, b["blocks"], b["threads"], b["line"]))
            for c in checks:
                if not fnmatch.fnmatchcase(name, c["glob"]) or c["arch"] not in ("*", arch):
                    continue
                c["used"] = True
                scope = ins
                if c["scope"].startswith("loop:"):
                    scope = loop_of(ins, c["scope"][5:])
                    if scope is None:
                        fails.append("%s: no loop encloses its %s (line %d)" % (where, c["scope"][5:], c["line"]))
                        continue
                v = count(scope, c["op"])
                what = "%s %s in %s %s %d" % (c["op"], v, c["scope"], c["rel"], c["n"])
                ok = holds(v, c["rel"], c["n"])
                if c["kind"] == "require" and not ok:
                    fails.append("%s: %s does not hold (%d found, line %d)" % (where, what, v, c["line"]))
                elif c["kind"] == "gap" and ok:
                    fails.append("%s: known gap closed (%s holds now): make line %d a 'require' line" %
                                 (where, what, c["line"]))
                elif c["kind"] == "gap":
                    note = "" if v == c["today"] else " (recorded %d: update line %d)" % (c["today"], c["line"])
                    gaps.append("%s: %s %s %s %d not met: %d today%s" % (where, c["op"], c["scope"], c["rel"], c["n"],
                                                                          v, note))
    for c in checks:
        if not c["used"]:
            fails.append("%s:%d: '%s %s %s' matches no kernel of the module" % (a.expect, c["line"], c["kind"], c["arch"],
                                                                                c["glob"]))
    print()
    for g in gaps:
        print("KNOWN GAP " + g)
    for f in fails:
        print("FAIL " + f)
    n_checks = sum(1 for c in checks if c["used"])
    print("test_sass: %d kernels x %d architectures, %d check lines, %d known gaps, %d failures" %
          (len(names), len(archs), n_checks, len(gaps), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
