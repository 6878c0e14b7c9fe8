"""``relu2 inspect``: what actually ran for one cell, read from the compiled code rather than inferred.

For an implementation on an input (dtype, shape, device), after the same warm-up a measurement
gets (``Implementation.prepare``):

* the fingerprint the results record, and whether the output agrees bitwise;
* the kernels one call launches (CUDA, from the profiler);
* for the compiled paths, the code inductor generated for the graph dynamo's guards pick (Triton on
  CUDA, C++ on the CPU) and its launch configuration;
* the width of every global load and store, counted in the PTX of the Triton kernels and in the
  SASS of the fused extension (``ld.global.v4.b32`` is a 128-bit vector; ``ld.global.b16`` a 16-bit
  scalar), which is what separates a kernel at the copy roofline from one at a fraction of it;
* the work one call did, as Nsight Compute counts it (``relu2.measure.counters``, in a child under
  ncu): each kernel's launch and exact counters, or why they are not counted here.

Everything compiled here goes to private, empty caches (``relu2.measure.isolation.private_caches``, as in a
measurement's worker), so the PTX found in them is exactly what this process compiled; the warm-up,
agreement and fingerprint are ``relu2.measure.cell.prepare_and_check``, a measurement's own steps.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from relu2.measure import counters, isolation
from relu2.records.work import Work
from relu2.vocab.errors import UsageError
from relu2.vocab.schema import EXACT, Cell, format_shape

# ld.global.v4.b32, st.global.b16, ld.global.nc.L1::evict_last.v2.u32 ...
_PTX_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[A-Za-z0-9_:]+)+)")
# LDG.E.128, STG.E.U16, LDG.E.64.CONSTANT, LDG.E (32-bit) ...
_SASS_ACCESS = re.compile(r"\b(LDG|STG)((?:\.[A-Z0-9_]+)*)")
_WRAPPER_KERNEL = re.compile(r"^(\w+) = async_compile\.(triton|cpp_pybinding|cpp)\(.*?r?'''(.*?)'''", re.S | re.M)


@dataclass(frozen=True)
class Access:
    """Global memory instructions of one kind: "load" or "store", ``bits`` wide (vector x element), ``count`` of them."""

    op: str
    bits: int
    count: int
    example: str

    def describe(self) -> str:
        kind = "vector" if self.bits > 32 else "scalar"
        return f"{self.op}s: {self.count} x {self.bits}-bit ({kind}; e.g. {self.example})"


def ptx_accesses(ptx: str) -> list[Access]:
    """Global loads and stores in PTX text, by width: vector lanes x element bits."""
    found: Counter[tuple[str, int]] = Counter()
    examples: dict[tuple[str, int], str] = {}
    for match in _PTX_ACCESS.finditer(ptx):
        parts = match.group(2).strip(".").split(".")
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
        element = next((int(p[1:]) for p in reversed(parts) if re.fullmatch(r"[bufs]\d+", p)), 0)
        if not element:
            continue
        key = ("load" if match.group(1) == "ld" else "store", lanes * element)
        found[key] += 1
        examples.setdefault(key, match.group(0))
    return [Access(op, bits, n, examples[(op, bits)]) for (op, bits), n in sorted(found.items())]


def sass_accesses(sass: str) -> list[Access]:
    """Global loads and stores in SASS text (LDG/STG), by width: .128, .64, .U16, plain is 32-bit."""
    widths = {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}
    found: Counter[tuple[str, int]] = Counter()
    examples: dict[tuple[str, int], str] = {}
    for match in _SASS_ACCESS.finditer(sass):
        suffixes = match.group(2).strip(".").split(".")
        bits = next((widths[s] for s in suffixes if s in widths), 32)
        key = ("load" if match.group(1) == "LDG" else "store", bits)
        found[key] += 1
        examples.setdefault(key, match.group(0))
    return [Access(op, bits, n, examples[(op, bits)]) for (op, bits), n in sorted(found.items())]


def wrapper_kernels(code: str) -> list[tuple[str, str, str]]:
    """(name, "triton" or "cpp", source) of each kernel in an inductor wrapper module's source."""
    return [(m.group(1), "triton" if m.group(2) == "triton" else "cpp", m.group(3).strip())
            for m in _WRAPPER_KERNEL.finditer(code)]


@dataclass
class Kernel:
    """One kernel of what ran: its source (when generated), launch configuration and memory accesses."""

    name: str
    language: str  # "triton", "cpp", "cuda"
    source: str = ""
    launch: str = ""
    accesses: list[Access] = field(default_factory=list)
    accesses_from: str = ""  # "PTX", "SASS", or why none


@dataclass
class Explanation:
    """What ran for one cell: ``relu2 inspect``'s result."""

    impl: str
    description: str
    dtype: str
    shape: tuple[int, ...]
    device: str
    fingerprint: str
    agreement: str  # "ok" or the mismatch
    agrees: bool  # False: the output differs from eager's (relu2 inspect exits 1, as relu2 check does)
    warmup: str  # the shape it met first, or ""
    launched: list[str] = field(default_factory=list)  # kernel names one call launches (CUDA)
    kernels: list[Kernel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def explain(name: str, dtype: str, shape: tuple[int, ...], device: str) -> Explanation:
    """Run ``name`` once on a fresh (dtype, shape) input as a measurement would, and say what ran."""
    with isolation.private_caches("relu2-inspect-") as caches:  # looked up at the call: tests spy on it
        return _explain(name, dtype, shape, device, caches)


def _explain(name: str, dtype: str, shape: tuple[int, ...], device: str, caches: Path) -> Explanation:
    import torch

    from relu2.measure.agreement import AgreementError
    from relu2.measure.cell import fresh_input, prepare_and_check
    from relu2.measure.compiled import Compiled
    from relu2.measure.registry import get

    impl = get(name)
    if not impl.supports(device):
        raise UsageError(f"{name} cannot run on {device}: {impl.why_not(device).splitlines()[0]}")
    warmup = ""
    if isinstance(impl.fn, Compiled):
        first = impl.fn.warmup_shape(shape)
        warmup = format_shape(first) if first else ""
    cell = Cell(name, dtype, math.prod(shape), tuple(shape))
    try:  # the steps a measurement takes before its timings (relu2.measure.cell)
        x, kernel = prepare_and_check(impl, cell, device)
        agreement, agrees = ("ok (bitwise equal to eager)" if impl.is_relu2 else "n/a (a reference, not relu²)"), True
    except AgreementError as e:  # shown, and what ran is inspected all the same
        agreement, agrees = f"FAILED: {e}", False
        x = fresh_input(cell, device)
        kernel = impl.fingerprint(x) if impl.fingerprint else ""
    impl.fn(x)
    if device == "cuda":
        torch.cuda.synchronize()
    result = Explanation(
        impl=name, description=impl.description, dtype=dtype, shape=tuple(shape), device=device,
        fingerprint=kernel, agreement=agreement, agrees=agrees, warmup=warmup,
    )
    if device == "cuda":
        result.launched = _launched_kernels(impl.fn, x)
    if isinstance(impl.fn, Compiled):
        result.kernels = _compiled_kernels(impl.fn, x, caches)
    elif impl.kernel is not None:  # a kernel of the implementation's own (interface 1 says which)
        result.kernels = [_own_kernel(impl.kernel(x), caches)]
    else:
        result.notes.append("runs torch's own kernels: no generated code")
    return result


def _launched_kernels(fn, x) -> list[str]:
    """Names of the GPU kernels one call launches, in order (the profiler's view)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _compiled_kernels(path, x, caches: Path) -> list[Kernel]:
    from relu2.measure.compiled import serving_code

    code = serving_code(path, x)
    if not code:
        return [Kernel("?", "?", accesses_from="dynamo picked no graph this process compiled")]
    from relu2.measure.compiled import launch_configs

    kernels = []
    configs = launch_configs(code)
    for name, language, source in wrapper_kernels(code):
        launch = configs.get(name)
        kernel = Kernel(name, language, source=source, launch=launch.describe() if launch else "")
        if language == "triton":
            kernel.accesses, kernel.accesses_from = _ptx_of(name, caches)
        else:
            kernel.accesses_from = "C++ for the CPU: no GPU load/store instructions"
        kernels.append(kernel)
    return kernels


def _ptx_of(kernel_name: str, caches: Path) -> tuple[list[Access], str]:
    ptx = sorted(caches.rglob(f"{kernel_name}.ptx"))
    if not ptx:
        return [], f"no {kernel_name}.ptx in the private Triton cache"
    return ptx_accesses(ptx[-1].read_text()), "PTX"


def _own_kernel(own, caches: Path) -> Kernel:
    """An implementation's own kernel (``relu2.vocab.interface.Kernel``) with the width of its loads and
    stores: from the PTX in the call's Triton cache, or the SASS of its binary."""
    kernel = Kernel(own.name, own.language, source=own.source, launch=own.launch)
    if own.language == "triton":
        kernel.accesses, kernel.accesses_from = _ptx_of(own.name, caches)
        return kernel
    if own.language != "cuda" or not own.binary:
        kernel.accesses_from = f"{own.language} for the CPU: no GPU load/store instructions"
        return kernel
    tool = shutil.which("cuobjdump")
    if tool is None:
        kernel.accesses_from = "cuobjdump not found (it comes with the CUDA toolkit)"
        return kernel
    sass = subprocess.run([tool, "--dump-sass", own.binary], capture_output=True, text=True, timeout=120).stdout
    kernel.accesses = sass_accesses(sass)
    kernel.accesses_from = "SASS" if kernel.accesses else f"no SASS read from {own.binary}"
    return kernel


def format_explanation(e: Explanation, show_source: bool = True) -> str:
    """``relu2 inspect``'s output."""
    shape = format_shape(e.shape)
    lines = [f"{e.impl} on {e.dtype} {shape} ({e.device})", f"  how:         {e.description}"]
    if e.warmup:
        lines.append(f"  warm-up:     first called at {e.warmup} (then this shape)")
    lines += [f"  agreement:   {e.agreement.splitlines()[0]}", f"  fingerprint: {e.fingerprint or '-'}"]
    if e.launched:
        lines.append(f"  launches:    {len(e.launched)} kernel(s): {', '.join(_short(n) for n in e.launched)}")
    for note in e.notes:
        lines.append(f"  note:        {note}")
    for k in e.kernels:
        lines.append(f"\nkernel {k.name} ({k.language})")
        if k.launch:
            lines.append(f"  launch:   {k.launch}")
        if k.accesses:
            lines += [f"  {a.describe()}" for a in k.accesses]
            lines.append(f"  (from the {k.accesses_from})")
        elif k.accesses_from:
            lines.append(f"  accesses: {k.accesses_from}")
        if show_source and k.source and k.language in ("triton", "cpp"):
            lines += ["  source:", *("    " + line for line in k.source.splitlines())]
    return "\n".join(lines)


def counted_work(cell: Cell, device: str) -> str:
    """The work of one call of ``cell`` as ``format_work`` says it, counted under ncu, or why not here."""
    why = counters.unavailable(device)
    if why:
        return f"work counters: {why}"
    try:
        counted = counters.count([cell])
    except RuntimeError as e:
        return f"work counters: not counted: {e}"
    work = counted.work(cell)
    if work is None:
        return f"work counters: not counted: {(counted.failed.get(cell) or '?').splitlines()[0]}"
    return format_work(work)


def format_work(work: Work) -> str:
    """Each kernel one call launched, its launch and exact counters (identical in every A/A: any
    difference between two commits is other work; docs/methodology.md, "Work counters")."""
    lines = [f"work counters (Nsight Compute, one call, exact): {len(work.kernels)} kernel(s)"]
    for k in work.kernels:
        lines.append(f"  {_short(k.name.split('(')[0], 70)}  grid {k.grid} block {k.block}, {k.registers} registers")
        lines.append("    " + ", ".join(f"{name} {k.counts.get(name, math.nan):,.0f}" for name in EXACT))
    return "\n".join(lines)


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[:width] + "..."


__all__: Iterable[str] = ("Access", "Explanation", "Kernel", "counted_work", "explain", "format_explanation",
                          "format_work", "ptx_accesses", "sass_accesses", "wrapper_kernels")
