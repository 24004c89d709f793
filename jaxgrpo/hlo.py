# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Reading an optimized HLO module (``compiled.as_text()``): HBM bytes each kernel of a loop body must move, the
kernels launched per iteration, and the copies, transposes, pads and sorts of large buffers inside the loop.

Traffic model (the compulsory HBM traffic of each kernel as XLA emitted it; caches, re-reads and L2 hits ignored),
after the method of ``shared/gpu-aot/hlo_bytes.py``:
  * every top-level instruction of a computation is one kernel, except the free ones (parameters, constants, tuples,
    get-tuple-elements, bitcasts: no data moves);
  * an array in another memory space than HBM (``S(1)`` in its layout: a TPU's on-chip VMEM) moves no HBM bytes;
    an asynchronous ``copy-start`` reads its source and writes its destination, its ``copy-done`` nothing;
  * bytes written = the output's size; a cuBLAS custom call's ``s8`` workspace is not counted; an in-place
    dynamic-update-slice or scatter (a top-level one, or a fusion whose root is one; XLA updates its operand's buffer
    in place and inserts an explicit copy where it cannot) writes its updates only; a Pallas kernel's output aliased
    to an operand (``output_to_operand_aliasing``) is updated in place by the kernel's own stores, which the HLO does
    not show: not counted (the decode layer kernel's are a key and a value a row, `models.pallas_attention`), while
    a cuBLAS call's aliased output (its fused residual add, ``C`` read and ``D`` written whole) is;
  * bytes read = each operand's size, except a fusion parameter used only through slice/dynamic-slice/gather ops (the
    slices are read) and the buffer a dynamic-update-slice or scatter updates in place (not read);
  * a nested ``while`` counts ``trip count x`` its body (``known_trip_count`` of its backend config, or its condition's
    ``counter < constant``; else 1, and flagged), a ``conditional`` its most expensive branch (the worst case of one
    iteration).

``loop_report(text)`` gives this for the entry computation's heaviest while loop: the decode program's token loop,
whose per-iteration bytes are the bytes moved per token step (all layers, LM head and draw included).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
             "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}  # fmt: skip
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([0-9,]*)\]")
# an array with its layout, whose ``S(n)`` (n > 0) places it in another memory space than HBM: a TPU's on-chip
# VMEM (1) or its semaphores (2); such a buffer costs no HBM traffic to read or write
_ARRAY_LAYOUT = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([0-9,]*)\](\{[^}]*\})?")
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id"}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.+?) ([a-z][a-z0-9\-]*)\((.*)$")
# the custom calls of hand-written (Pallas) kernels: Triton on GPUs, Mosaic on TPUs
_KERNEL_CALLS = ("__gpu$xla.gpu.triton", "tpu_custom_call")
RESHAPES = ("copy", "transpose", "pad", "concatenate")  # kernels that move a buffer without computing on it


@dataclasses.dataclass(frozen=True)
class Instr:
    name: str
    op: str
    shape: str
    operands: tuple[str, ...]
    line: str
    root: bool


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel of a loop iteration: ``count`` launches per iteration (the trip counts of the loops around it)."""

    name: str
    kind: str
    read: int
    write: int
    shape: str
    count: int = 1


@dataclasses.dataclass(frozen=True)
class Finding:
    """A kernel inside the loop that copies, transposes, pads, concatenates or dynamic-slices (a copy of a slice: one
    layer's weights out of the stacked ones) a buffer of ``bytes`` (its largest array), or a sort."""

    op: str
    shape: str
    bytes: int
    where: str  # the kernel (top-level instruction) it belongs to
    source: str  # the jax op it came from (HLO metadata op_name), if any


@dataclasses.dataclass(frozen=True)
class LoopReport:
    body: str
    kernels: list[Kernel]
    findings: list[Finding]
    unknown_trip_counts: int

    @property
    def bytes_per_iteration(self) -> int:
        return sum((k.read + k.write) * k.count for k in self.kernels)

    @property
    def launches_per_iteration(self) -> int:
        """Kernels launched per iteration; an asynchronous copy's completion (``copy-done``) is a wait, not one."""
        return sum(k.count for k in self.kernels if k.kind != "copy-done")

    def top(self, n: int = 10) -> list[Kernel]:
        return sorted(self.kernels, key=lambda k: -(k.read + k.write) * k.count)[:n]


def _hbm_arrays(shape: str) -> list[int]:
    """Bytes of each array of an HLO shape string in HBM, in order (0 for one placed on chip, ``S(n)`` with n > 0)."""
    return [0 if _ON_CHIP.search(layout) else math.prod(int(d) for d in dims.split(",") if d) * _ITEMSIZE[dt]
            for dt, dims, layout in _ARRAY_LAYOUT.findall(shape)]  # fmt: skip


def array_bytes(shape: str) -> int:
    """HBM bytes of every array in an HLO shape string (a tuple's leaves summed; an array whose layout places it in
    another memory space, ``S(1)`` a TPU's on-chip VMEM, counts 0)."""
    return sum(_hbm_arrays(shape))


def _largest_array(shape: str) -> int:
    return max(_hbm_arrays(shape), default=0)


def _operand_names(rest: str) -> tuple[str, ...]:
    depth = 1
    for i, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return tuple(re.findall(r"%([\w.\-]+)", rest[:i]))
    return tuple(re.findall(r"%([\w.\-]+)", rest))


def parse(text: str) -> dict[str, list[Instr]]:
    """Computations of an HLO module text by name, each a list of its instructions in order."""
    comps: dict[str, list[Instr]] = {}
    current = None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m and not line.startswith(" "):
            current = comps.setdefault(m.group(1), [])
            if line.startswith("ENTRY"):
                comps["__entry__"] = current
            continue
        if current is not None and line.strip() == "}":
            current = None
            continue
        m = _INSTRUCTION.match(line) if current is not None else None
        if m:
            current.append(Instr(m.group(2), m.group(4), m.group(3), _operand_names(m.group(5)), line.strip(),
                                 bool(m.group(1))))  # fmt: skip
    return comps


def _called(ins: Instr, attr: str) -> list[str]:
    m = re.search(attr + r"=(?:\{([%\w.\-, ]+)\}|%?([\w.\-]+))", ins.line)
    return [c.strip().lstrip("%") for c in (m.group(1) or m.group(2)).split(",")] if m else []


def _fusion_reads(fused: list[Instr]) -> tuple[dict[int, int | None], int | None]:
    """Per parameter index of a fused computation: bytes read when only sliced (slice/dynamic-slice/gather) or
    updated in place (0), ``None`` when read whole; and the update's bytes when the root is an in-place
    dynamic-update-slice or scatter."""
    by_name = {i.name: i for i in fused}
    users = collections.defaultdict(list)
    for i in fused:
        for o in i.operands:
            users[o].append(i)

    def real_users(name: str) -> list[tuple[str, Instr]]:
        out = []
        for u in users[name]:
            out += real_users(u.name) if u.op == "bitcast" else [(name, u)]
        return out

    root = next(i for i in fused if i.root)
    while root.op == "bitcast" and root.operands and root.operands[0] in by_name:  # TPU: bitcast(dynamic-update-slice)
        root = by_name[root.operands[0]]
    target = update = None
    if root.op == "dynamic-update-slice" or (root.op == "scatter" and len(root.operands) == 3):
        target, new = root.operands[0], root.operands[-1 if root.op == "scatter" else 1]
        update = array_bytes(by_name[new].shape) if new in by_name else None
    reads: dict[int, int | None] = {}
    for p in (i for i in fused if i.op == "parameter"):
        index = int(re.match(r"\s*(\d+)", p.line.split("parameter(", 1)[1]).group(1))
        us = real_users(p.name)
        if us and all(u.op in ("slice", "dynamic-slice", "gather") and u.operands[0] == src for src, u in us):
            reads[index] = sum(array_bytes(u.shape) for _, u in us)
        elif target is not None and any(u is root and root.operands[0] == src for src, u in us) or p.name == target:
            reads[index] = 0
        else:
            reads[index] = None
    return reads, update


def _kernel(comps: dict[str, list[Instr]], ins: Instr, shapes: dict[str, str]) -> Kernel:
    write, read, ops = array_bytes(ins.shape), 0, ins.operands
    kind = ins.op
    if ins.op == "custom-call":
        if "s8[" in ins.shape:  # cuBLAS: (result, workspace)
            write = array_bytes(ins.shape.split("s8[")[0])
        target = re.search(r'custom_call_target="([^"]+)"', ins.line)
        kind = "custom-call:" + (target.group(1) if target else "?")
        aliased = re.search(r"output_to_operand_aliasing=\{(.*?)\}, ", ins.line)
        if aliased and target and target.group(1) in _KERNEL_CALLS:  # a Pallas kernel's in-place outputs
            outs = {int(i or 0) for i in re.findall(r"\{(\d*)\}: \(", aliased.group(1))}
            write = sum(b for i, b in enumerate(_hbm_arrays(ins.shape)) if i not in outs)
    if ins.op == "fusion":
        fused = _called(ins, "calls")[0]
        reads, update = _fusion_reads(comps[fused])
        read = sum(array_bytes(shapes.get(o, "")) if reads.get(k) is None else reads[k] for k, o in enumerate(ops))
        write = write if update is None else update
        kind = "fusion:" + re.sub(r"(\.\d+)+$", "", ins.name)
    elif ins.op == "copy-start":  # an asynchronous copy (a TPU's prefetch into VMEM): (destination, source, context)
        read, write = sum(array_bytes(shapes.get(o, "")) for o in ops), (_hbm_arrays(ins.shape) or [0])[0]
    elif ins.op == "copy-done":  # its completion: no bytes of its own
        read = write = 0
    else:
        if ins.op == "dynamic-update-slice":
            write, ops = array_bytes(shapes.get(ops[1], "")), ops[1:2] + ops[2:]
        elif ins.op == "scatter" and len(ops) == 3:  # in place: the indices and updates read, the updates written
            write, ops = array_bytes(shapes.get(ops[2], "")), ops[1:]
        read = sum(array_bytes(shapes.get(o, "")) for o in ops)
    return Kernel(ins.name, kind, read, write, ins.shape[:80])


def _source(ins: Instr) -> str:
    m = re.search(r'op_name="([^"]+)"', ins.line)
    return m.group(1) if m else ""


def _roots(comps: dict[str, list[Instr]], ins: Instr) -> list[Instr]:
    """What a kernel produces: the instruction itself, or its fusion's root (a tuple root's operands, bitcasts seen
    through)."""
    if ins.op != "fusion":
        return [ins]
    fused = comps[_called(ins, "calls")[0]]
    by_name = {i.name: i for i in fused}
    out, todo = [], [next(i for i in fused if i.root)]
    while todo:
        i = todo.pop()
        if i.op in ("tuple", "bitcast"):
            todo += [by_name[o] for o in i.operands if o in by_name]
        else:
            out.append(i)
    return out


def _findings(comps: dict[str, list[Instr]], ins: Instr, min_bytes: int, vocab: int | None) -> list[Finding]:
    """The kernel ``ins`` when it exists to move a buffer of >= ``min_bytes`` (its output is a copy, transpose, pad,
    concatenation or dynamic slice; one fused into a computing kernel costs no extra traffic and is not reported),
    and every sort in it whose last dimension is >= ``vocab`` (any sort when ``vocab`` is None)."""
    out = [Finding(r.op, r.shape[:80], _largest_array(r.shape), ins.name, _source(r)) for r in _roots(comps, ins)
           if r.op in RESHAPES + ("dynamic-slice",) and _largest_array(r.shape) >= min_bytes]  # fmt: skip
    inner = [ins] + (comps[_called(ins, "calls")[0]] if ins.op == "fusion" else [])
    for i in inner:
        if i.op == "sort":
            last = [d for d in _ARRAY.search(i.shape).group(2).split(",") if d]
            if vocab is None or (last and int(last[-1]) >= vocab):
                out.append(Finding("sort", i.shape[:80], _largest_array(i.shape), ins.name, _source(i)))
    return out


def _trip_count(comps: dict[str, list[Instr]], ins: Instr) -> int | None:
    """A while loop's trip count: XLA's ``known_trip_count`` (GPU backend config), else a condition that is one
    ``counter < constant`` comparison (a ``lax.scan`` or ``fori_loop`` from 0 by 1, as TPU HLO leaves it)."""
    m = re.search(r'known_trip_count"?\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', ins.line)
    if m:
        return int(m.group(1))
    cond = comps.get((_called(ins, "condition") or [""])[0], [])
    root = next((i for i in cond if i.root), None)
    if root is None or root.op != "compare" or "direction=LT" not in root.line:
        return None
    consts = {i.name: i for i in cond if i.op == "constant" and i.shape.startswith("s32[]")}
    bound = consts.get(root.operands[1]) if len(root.operands) == 2 else None
    return int(re.search(r"constant\((-?\d+)\)", bound.line).group(1)) if bound else None


def body_report(comps: dict[str, list[Instr]], body: str, *, min_bytes: int = 1 << 20, vocab: int | None = None,
                count: int = 1) -> LoopReport:  # fmt: skip
    """Kernels and findings of one iteration of the loop whose body computation is ``body`` (nested loops expanded
    by their trip counts, conditionals by their most expensive branch)."""
    shapes = {i.name: i.shape for i in comps[body]}
    kernels, findings, unknown = [], [], 0
    for ins in comps[body]:
        if ins.op in _FREE:
            continue
        if ins.op == "while":
            trips = _trip_count(comps, ins)
            unknown += trips is None
            sub = body_report(comps, _called(ins, "body")[0], min_bytes=min_bytes, vocab=vocab,
                              count=count * (trips or 1))  # fmt: skip
        elif ins.op == "conditional":
            branches = _called(ins, "branch_computations") or _called(ins, "true_computation") + _called(
                ins, "false_computation")  # fmt: skip
            subs = [body_report(comps, b, min_bytes=min_bytes, vocab=vocab, count=count) for b in branches]
            sub = max(subs, key=lambda r: r.bytes_per_iteration)
            findings += [f for s in subs for f in s.findings if s is not sub]
        else:
            k = _kernel(comps, ins, shapes)
            kernels.append(dataclasses.replace(k, count=count))
            findings += _findings(comps, ins, min_bytes, vocab)
            continue
        kernels += sub.kernels
        findings += sub.findings
        unknown += sub.unknown_trip_counts
    return LoopReport(body, kernels, findings, unknown)


def loop_report(text: str, *, min_bytes: int = 1 << 20, vocab: int | None = None) -> LoopReport:
    """`body_report` of the entry computation's while loop that moves the most bytes per iteration.

    ``min_bytes``: a copy/transpose/pad is reported when its largest array has at least this many bytes (pass the
    smallest weight or cache buffer to see every copy of one); ``vocab``: report the sorts whose last dimension is at
    least this (None: every sort)."""
    comps = parse(text)
    loops = [i for i in comps.get("__entry__", []) if i.op == "while"]
    if not loops:
        raise ValueError("the HLO module's entry computation has no while loop")
    reports = [body_report(comps, _called(w, "body")[0], min_bytes=min_bytes, vocab=vocab) for w in loops]
    return max(reports, key=lambda r: r.bytes_per_iteration)


def sorts(text: str, min_last_dim: int = 0) -> list[Finding]:
    """Every sort instruction of the module (fused or not, in any computation) whose last dimension is at least
    ``min_last_dim``: e.g. a full-vocabulary sort of a token draw."""
    out = []
    for name, comp in parse(text).items():
        for i in comp if name != "__entry__" else []:  # the entry is also listed under its own name
            dims = _ARRAY.search(i.shape) if i.op == "sort" else None
            last = [int(d) for d in dims.group(2).split(",") if d] if dims else []
            if dims and (last[-1] if last else 1) >= min_last_dim:
                out.append(Finding("sort", i.shape[:80], _largest_array(i.shape), name, _source(i)))
    return out


def program_bytes(text: str, *, min_bytes: int = 1 << 20, vocab: int | None = None) -> LoopReport:
    """`body_report` of the whole program (the entry computation, every loop in it counted by its trip count): the
    compulsory HBM bytes of one call, e.g. one train step."""
    return body_report(parse(text), "__entry__", min_bytes=min_bytes, vocab=vocab)


def _kernel_computations(comps: dict[str, list[Instr]]) -> list[str]:
    """The computations whose instructions are kernels (their outputs live in HBM): the entry and, reachable from it,
    loop bodies and conditions, conditional branches and called computations (not fusions' or reducers' bodies)."""
    seen, todo = [], ["__entry__"]
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.append(name)
        for ins in comps[name]:
            if ins.op == "while":
                todo += _called(ins, "body") + _called(ins, "condition")
            elif ins.op == "conditional":
                todo += _called(ins, "branch_computations") + _called(ins, "true_computation") + _called(
                    ins, "false_computation")  # fmt: skip
            elif ins.op == "call":
                todo += _called(ins, "to_apply")
    return seen


def wide_buffers(text: str, dtype: str, dim: int) -> list[Finding]:
    """Every buffer a kernel writes to HBM (a top-level instruction's output, not a value inside a fusion) holding an
    array of ``dtype`` (``"f32"``) whose last dimension, logical or in memory (its layout's minor-most), is ``dim``:
    e.g. float32 ``[*, vocab]`` logits, probabilities or a transposed float32 copy of a ``[vocab, D]`` head."""
    comps = parse(text)
    out = []
    for name in _kernel_computations(comps):
        for ins in comps[name]:
            if ins.op in _FREE:
                continue
            for m in re.finditer(r"\b" + dtype + r"\[([0-9,]+)\](\{[0-9,]*)?", ins.shape):
                dims = [int(d) for d in m.group(1).split(",") if d]
                layout = [int(d) for d in (m.group(2) or "{").lstrip("{").split(",") if d]
                minor = dims[layout[0]] if layout else dims[-1]
                if len(dims) >= 2 and dim in (dims[-1], minor):
                    out.append(Finding(ins.op, m.group(0), math.prod(dims) * _ITEMSIZE[dtype], name, _source(ins)))
                    break
    return out


# -- XLA:GPU's thunk sequence: how the host launches a loop body ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HostLaunches:
    """How the host runs one iteration of a GPU program's heaviest while loop (the decode block's token step), read
    from XLA:GPU's thunk sequence after its thunk passes: ``launches`` separate host launches (a command buffer, i.e. a
    CUDA graph, counts once), ``graphs`` of them command buffers, holding ``graphed`` of the body's ``thunks``."""

    launches: int
    graphs: int
    graphed: int
    thunks: int


def host_launches(thunks: str) -> HostLaunches:
    """`HostLaunches` of the ``body:`` with the most thunks in a thunk-sequence dump (``--xla_dump_to``'s
    ``*.thunk_sequence_after_thunk_passes.txt``: one thunk per line, ``NNN: kKind ...``, nested thunks indented four
    spaces deeper than their parent)."""
    best: HostLaunches | None = None
    lines = thunks.splitlines()
    for at, line in enumerate(lines):
        if line.strip() != "body:":
            continue
        base = len(line) - len(line.lstrip()) + 2  # the body's own thunks
        top: list[str] = []
        graphed = nested = 0
        for sub in lines[at + 1:]:
            depth = len(sub) - len(sub.lstrip())
            if not sub.strip() or depth < base or sub.strip().endswith(":") and depth <= base:
                break
            kind = sub.split()[1] if len(sub.split()) > 1 else ""
            if depth == base:
                top.append(kind)
            elif depth == base + 4:
                nested += 1
                graphed += top[-1] == "kCommandBuffer"
        found = HostLaunches(len(top), top.count("kCommandBuffer"), graphed, len(top) - top.count("kCommandBuffer")
                             + nested)  # fmt: skip
        if best is None or found.thunks > best.thunks:
            best = found
    if best is None:
        raise ValueError("the thunk sequence has no while loop body")
    return best


def compile_with_thunks(lowered: object, options: dict | None) -> tuple[object, str | None]:
    """Compile a lowered GPU program and return it with its thunk sequence after XLA's thunk passes (`host_launches`
    reads it), dumped for this compile only (``xla_dump_to`` a temporary directory); None when XLA compiled nothing
    (a persistent compilation cache hit) or dumped no thunks (not a GPU compile)."""
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        compiled = lowered.compile(dict(options or {}, xla_dump_to=tmp))  # type: ignore[attr-defined]
        after = sorted(pathlib.Path(tmp).glob("*thunk_sequence_after_thunk_passes.txt"))
        found = after or sorted(pathlib.Path(tmp).glob("*thunk_sequence.txt"))  # no pass changed anything
        return compiled, found[-1].read_text() if found else None
