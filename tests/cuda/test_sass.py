#!/usr/bin/env python3
"""test_sass.py - static checks of the GPU module's machine code (SASS) for every architecture it
embeds (sm_80, sm_90): disassembles libckv_cuda.so with cuobjdump, prints per kernel its registers,
local memory, shared memory and instruction mix (whole kernel, and inside the loop that encloses all
of its tensor-core instructions: the prefill's per-tile figures), and checks them against
tests/cuda/sass_expect.txt:
  - no kernel uses local memory (LOCAL 0 and no LDL/STL: no register spills, no stack arrays);
  - every kernel's registers fit the budget of its intended occupancy (a 'budget' line per kernel);
  - 'require' lines hold (e.g. LDGSTS and LDSM in the prefill tile loop, no generic LD.E there),
    counted in the whole kernel or in a loop (loop:OPC, the smallest loop enclosing every OPC;
    inner:OPC, each innermost loop holding an OPC; a loop is a backward branch's range: the format
    is described at the top of sass_expect.txt);
  - 'gap' lines are requirements that today's kernels do not meet yet: reported with today's count
    (recorded in the file) and not failed; one that is met now fails, so that it becomes a
    'require' line and the file stays true.
It needs no GPU. Exit 0 when every check passes, 1 on a failure, 77 (skip) when the module or
cuobjdump is absent, saying which.
  test_sass.py --module build/libckv_cuda.so --expect tests/cuda/sass_expect.txt [--cuobjdump PATH]
  test_sass.py --self-test --expect tests/cuda/sass_expect.txt
--self-test checks the scopes and messages on a synthetic kernel and that the expectations parse
(no module or cuobjdump needed).
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
import tempfile

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


def loops_in(instrs):
    """The kernel's loops as (first, last) addresses: a branch to an earlier (or its own) label
    closes a loop whose body runs from that label to the branch. The branch to itself that ends
    every kernel (after its EXIT) is no loop."""
    return [(t, a) for a, _, t in instrs if t is not None and t < a]


def loop_of(instrs, pattern):
    """The instructions of the smallest loop (a backward branch's range) enclosing every instruction
    that matches pattern; None when there is no such instruction or no such loop."""
    at = [a for a, mn, _ in instrs if matches(pattern, mn)]
    if not at:
        return None
    lo, hi = min(at), max(at)
    loops = [(t, a) for t, a in loops_in(instrs) if t <= lo and a >= hi]
    if not loops:
        return None
    t, a = min(loops, key=lambda r: r[1] - r[0])
    return [x for x in instrs if t <= x[0] <= a]


def inner_loops_of(instrs, pattern):
    """[(first, last, instructions)] of the innermost loops of pattern, in address order: the loops
    that hold an instruction matching it and enclose no other loop that holds one. Matching
    instructions outside those loops (a pipeline's prologue, an outer loop's own body) are left
    out. Empty when no matching instruction sits in a loop."""
    at = [a for a, mn, _ in instrs if matches(pattern, mn)]
    holding = [(t, b) for t, b in loops_in(instrs) if any(t <= a <= b for a in at)]
    inner = {(t, b) for t, b in holding
             if not any(t <= t2 and b2 <= b and (t2, b2) != (t, b) for t2, b2 in holding)}
    return [(t, b, [x for x in instrs if t <= x[0] <= b]) for t, b in sorted(inner)]


def scoped(instrs, scope):
    """The instruction lists a requirement's SCOPE names: [(where, instructions)], where says which
    part of the kernel (for messages); None when the scope holds no loop."""
    if scope == "kernel":
        return [("the kernel", instrs)]
    if scope.startswith("loop:"):
        body = loop_of(instrs, scope[5:])
        return [("the loop enclosing every %s (%d instructions)" % (scope[5:], len(body)), body)] if body else None
    found = inner_loops_of(instrs, scope[6:])
    return [("the innermost loop of %s at 0x%05x-0x%05x (%d instructions)" % (scope[6:], t, b, len(body)), body)
            for t, b, body in found] or None


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
                         "rel": line[5], "n": int(line[6]), "line": n, "used": set()}
                    if c["rel"] not in ("==", ">=", "<="):
                        raise ValueError("relation %s" % c["rel"])
                    if not (c["scope"] == "kernel" or re.fullmatch(r"(loop|inner):[A-Z][A-Z0-9_.]*", c["scope"])):
                        raise ValueError("scope %s (kernel, loop:OPCODE or inner:OPCODE)" % c["scope"])
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


def check_one(c, where, ins):
    """One 'require' or 'gap' line c against a kernel's instructions: ("fail", message), ("gap",
    message) for a known gap still open, or (None, None) when the line holds. Scoped to loops, the
    line must hold in every loop of its scope; the message names the first loop where it does not."""
    what = "%s %s %s %d" % (c["op"], c["scope"], c["rel"], c["n"])
    parts = scoped(ins, c["scope"])
    if parts is None:
        opc = c["scope"].split(":", 1)[1]
        k = count(ins, opc)
        why = "none of its %d %s sits inside a backward branch's range" % (k, opc) if k else "it has no %s" % opc
        return "fail", "%s: %s cannot be checked: %s (line %d)" % (where, what, why, c["line"])
    # what is reported: the first part where the line does not hold, else the first part
    v, part = next(((count(body, c["op"]), w) for w, body in parts if not holds(count(body, c["op"]), c["rel"], c["n"])),
                   (count(parts[0][1], c["op"]), parts[0][0]))
    ok = holds(v, c["rel"], c["n"])
    if c["kind"] == "require" and not ok:
        return "fail", "%s: %s does not hold: %d %s in %s (line %d)" % (where, what, v, c["op"], part, c["line"])
    if c["kind"] == "gap" and ok:
        return "fail", "%s: known gap closed (%s holds now): make line %d a 'require' line" % (where, what, c["line"])
    if c["kind"] == "gap":
        note = "" if v == c["today"] else " (recorded %d: update line %d)" % (c["today"], c["line"])
        return "gap", "%s: %s not met: %d today in %s%s" % (where, what, v, part, note)
    return None, None


# A kernel for --self-test, in cuobjdump's layout: an HMMA before any loop (a pipeline's prologue),
# two copies of a tile loop (0x20-0x50; 0x60-0x90 with a generic load and no cp.async) inside an
# outer loop (0x20-0xa0), and the branch to itself after EXIT.
SELF_TEST_SASS = """
        code for sm_90
                Function : k
        /*0000*/                   HMMA.16816.F32.BF16 R0, R4, R8, R0 ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0020*/                   LDSM.16.M88.4 R4, [R3] ;
        /*0030*/                   HMMA.16816.F32.BF16 R0, R4, R8, R0 ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0050*/               @P0 BRA 0x20 ;
        /*0060*/                   LDSM.16.M88.4 R4, [R3] ;
        /*0070*/                   HMMA.16816.F32.BF16 R0, R4, R8, R0 ;
        /*0080*/                   LD.E R5, desc[UR4][R6.64] ;
        /*0090*/              @!P1 BRA 0x60 ;
        /*00a0*/               @P2 BRA 0x20 ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   BRA 0xc0 ;
"""


def self_test(expect):
    """Checks the scopes and messages on SELF_TEST_SASS and that `expect` parses; no module needed."""
    ins = parse_sass(SELF_TEST_SASS)[("sm_90", "k")]
    bad, n_checks = [], [0]

    def line(text, n=1):
        with open(os.path.join(tmp, "e.txt"), "w") as f:
            f.write("\n" * (n - 1) + text + "\n")
        return load_expect(os.path.join(tmp, "e.txt"))[1][0]

    def want(text, kind, *words):
        n_checks[0] += 1
        c = line(text, 7)
        got, msg = check_one(c, "sm_90 k", ins)
        if got != kind or (msg is None) != (kind is None) or any(w not in msg for w in words):
            bad.append("%r: got %s %r, expected %s naming %s" % (text, got, msg, kind, ", ".join(words)))
    with tempfile.TemporaryDirectory() as tmp:
        if loops_in(ins) != [(0x20, 0x50), (0x60, 0x90), (0x20, 0xa0)]:
            bad.append("loops %s: expected 0x20-0x50, 0x60-0x90, 0x20-0xa0 (not the branch to itself)" % loops_in(ins))
        if [(t, b) for t, b, _ in inner_loops_of(ins, "HMMA")] != [(0x20, 0x50), (0x60, 0x90)]:
            bad.append("inner loops around HMMA: %s" % [(t, b) for t, b, _ in inner_loops_of(ins, "HMMA")])
        want("require * k kernel HMMA == 3", None)
        want("require * k inner:HMMA LDSM == 1", None)
        want("require * k inner:HMMA LD.E == 0", "fail", "sm_90 k", "LD.E", "1 LD.E", "0x00060-0x00090", "line 7")
        want("require * k inner:HMMA LDGSTS >= 1", "fail", "LDGSTS", "0 LDGSTS", "0x00060-0x00090")
        want("require * k loop:HMMA HMMA == 3", "fail", "none of its 3 HMMA sits inside")
        want("require * k loop:LDSM LD.E == 1", None)
        want("require * k inner:STG STG == 0", "fail", "it has no STG")
        want("gap * k inner:HMMA LD.E == 0 today 1", "gap", "1 today", "0x00060-0x00090")
        want("gap * k inner:HMMA LD.E <= 1 today 1", "fail", "known gap closed")
        for text in ("require * k inner HMMA == 1", "require * k loops:HMMA HMMA == 1", "gap * k kernel HMMA == 1"):
            n_checks[0] += 1
            try:
                line(text)
                bad.append("%r was accepted" % text)
            except SystemExit:
                pass
    budgets, checks, stacks = load_expect(expect)
    for b in bad:
        print("FAIL self-test: " + b)
    print("test_sass --self-test: %d scope checks, %s parses (%d budgets, %d check lines, %d stacks), %d failures" %
          (n_checks[0] + 2, expect, len(budgets), len(checks), len(stacks), len(bad)))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module")
    ap.add_argument("--expect", required=True)
    ap.add_argument("--cuobjdump")
    ap.add_argument("--self-test", action="store_true", help="check the checker on a synthetic kernel; no module")
    a = ap.parse_args()
    if a.self_test:
        return self_test(a.expect)
    if not a.module:
        ap.error("--module is required (or --self-test)")
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
                c["used"].add(arch)
                kind, msg = check_one(c, where, ins)
                if kind == "fail":
                    fails.append(msg)
                elif kind == "gap":
                    gaps.append(msg)
    for c in checks:  # a line for every architecture ('*') must match a kernel of each
        for arch in sorted((set(archs) if c["arch"] == "*" else {c["arch"]}) - c["used"]):
            fails.append("%s:%d: '%s %s %s' matches no kernel of the module's %s code" % (
                a.expect, c["line"], c["kind"], c["arch"], c["glob"], arch))
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
