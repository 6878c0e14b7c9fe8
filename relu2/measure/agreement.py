"""The contract: every relu² implementation equals the eager native path bitwise, NaN positions included.

An implementation may declare an exception (``relu2.vocab.interface.Implementation``), never have one
silently:

* ``nan_to_zero``: NaN in gives +0 out, as vLLM's CUDA kernel does by design (its ``relu_squared_kernel``
  computes ``f > 0.0f ? f : 0.0f`` in fp32, and NaN fails the comparison: vLLM's
  csrc/activation_kernels.cu, PR #39058).  The expected output is then the reference with +0 exactly
  where the input is NaN, and bitwise equality everywhere else; -0 or a NaN there still fails.  An
  implementation that maps NaN to 0 without declaring it fails as before.
* ``writes_input``: the implementation overwrites its input (vLLM's routed experts run
  ``F.relu(x, inplace=True)``).  It is handed a clone, so the caller's tensor is never spoiled; the
  reference and the "input unmodified" check use the original.  Undeclared, modifying the input fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from relu2.measure.reference import relu_squared_reference
from relu2.vocab.schema import OK

if TYPE_CHECKING:
    from relu2.measure.registry import Implementation

_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


class AgreementError(AssertionError):
    """An implementation's output differs from the eager native path; the message says where and by how much."""


@dataclass(frozen=True)
class Mismatch:
    """How two tensors differ bitwise."""

    count: int
    numel: int
    max_ulp: float  # inf when a NaN meets a number
    first_index: tuple[int, ...]
    got: float
    expected: float

    def describe(self) -> str:
        return (
            f"{self.count} of {self.numel} elements differ, max {self.max_ulp:g} ULP; "
            f"first at index {self.first_index}: got {self.got!r}, expected {self.expected!r}"
        )


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Map float bit patterns to integers whose difference is the distance in ULPs (sign-magnitude to linear)."""
    bits = t.contiguous().view(_INT_VIEW[t.dtype]).to(torch.int64)
    nbits = t.element_size() * 8
    sign = bits < 0
    magnitude = bits & ((1 << (nbits - 1)) - 1)
    return torch.where(sign, -magnitude, magnitude)


def compare_bitwise(got: torch.Tensor, expected: torch.Tensor) -> Mismatch | None:
    """None when ``got`` equals ``expected`` bit for bit (any NaN payload matches NaN), else the Mismatch."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise ValueError(f"cannot compare {got.dtype}{tuple(got.shape)} with {expected.dtype}{tuple(expected.shape)}")
    g, e = got.detach().reshape(-1), expected.detach().reshape(-1)
    g_nan, e_nan = torch.isnan(g), torch.isnan(e)
    # Raw bits, not values: +0 and -0 differ, and relu² never yields -0, so a -0 is a defect.
    int_view = _INT_VIEW[g.dtype]
    differ = (g.contiguous().view(int_view) != e.contiguous().view(int_view)) & ~(g_nan & e_nan)
    differ |= g_nan != e_nan
    count = int(differ.sum())
    if count == 0:
        return None
    # -0 vs +0 is 0 ULP apart yet counted above as a mismatch; the count, not the ULP, says so.
    ulp = (_ordered_bits(g) - _ordered_bits(e)).abs().to(torch.float64)
    ulp = torch.where(g_nan | e_nan, torch.full_like(ulp, float("inf")), ulp)
    flat = int(torch.nonzero(differ)[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(got.shape))) if got.dim() else ()
    return Mismatch(
        count=count,
        numel=g.numel(),
        max_ulp=float(ulp[differ].max()),
        first_index=index,
        got=float(g[flat]),
        expected=float(e[flat]),
    )


def expected_output(impl: "Implementation", x: torch.Tensor) -> torch.Tensor:
    """What ``impl`` must return for ``x``: the eager native path's output, with a declared
    ``nan_to_zero`` applied (+0 exactly where ``x`` is NaN, nothing else changed)."""
    expected = relu_squared_reference(x)
    if impl.nan_to_zero:
        expected = torch.where(torch.isnan(x), torch.zeros_like(expected), expected)  # +0: zeros_like is +0
    return expected


def check_agreement(impl: "Implementation | str", x: torch.Tensor) -> None:
    """Raise AgreementError unless ``impl`` applied to ``x`` equals the eager native path bitwise.

    Same shape, dtype and device are required; NaN must sit exactly where the reference has NaN
    (or, for a declared ``nan_to_zero``, +0 must).  The input is not modified by the reference, and
    is checked to be unmodified by ``impl``; a declared ``writes_input`` implementation is given a
    clone of ``x``, so ``x`` is never modified.
    """
    from relu2.measure.registry import get

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"check_agreement needs a torch.Tensor input, got {type(x).__name__}")
    if x.dtype not in _INT_VIEW:
        raise TypeError(f"check_agreement needs a floating-point tensor ({', '.join(str(d).removeprefix('torch.') for d in _INT_VIEW)}), "
                        f"got {x.dtype}")
    impl = get(impl) if isinstance(impl, str) else impl
    if not impl.is_relu2:
        raise ValueError(f"{impl.name} is a reference, not relu²: there is no agreement to check")
    declared = f" (declared: {', '.join(impl.declared)})" if impl.declared else ""
    where = f"{impl.name}{declared} on {x.dtype} {tuple(x.shape)} ({x.device.type}, strides {tuple(x.stride())})"
    before = x.clone()
    expected = expected_output(impl, x)
    # A clone keeps x's strides where it can (dense layouts); a stride-0 view becomes contiguous,
    # since an in-place write to it is an error in torch, not a relu² result.
    got = impl.fn(x.clone() if impl.writes_input else x)
    if not isinstance(got, torch.Tensor):
        raise AgreementError(f"{where}: returned {type(got).__name__}, not a tensor")
    for what, g, e in (("shape", tuple(got.shape), tuple(expected.shape)), ("dtype", got.dtype, expected.dtype),
                       ("device", got.device, expected.device)):
        if g != e:
            raise AgreementError(f"{where}: {what} {g} differs from the reference's {e}")
    mismatch = compare_bitwise(got, expected)
    if mismatch is not None:
        raise AgreementError(f"{where}: {mismatch.describe()}")
    if compare_bitwise(x, before) is not None:
        raise AgreementError(f"{where}: the implementation modified its input")


# --- the agreement matrix: every implementation x dtype on the full input matrix ------------------


@dataclass(frozen=True)
class MatrixEntry:
    """One implementation at one dtype: "ok", "FAIL(n)" (n cases disagreed) or "n/a" (cannot run here)."""

    impl: str
    dtype: str
    verdict: str
    failures: tuple[str, ...] = ()  # "[case label]: message", one per failing case


@dataclass(frozen=True)
class Matrix:
    """``relu2 check``'s result: entries by implementation then dtype, and why some could not run."""

    device: str
    dtypes: tuple[str, ...]
    entries: tuple[MatrixEntry, ...]
    not_here: dict[str, str]  # implementation -> why it cannot run on this device (skipped)
    broken: dict[str, str]  # implementation -> why the project's own kernel cannot run (a failure)
    declared: dict[str, tuple[str, ...]] = field(default_factory=dict)  # implementation -> declared exceptions

    @property
    def failed(self) -> bool:
        return bool(self.broken) or any(e.failures for e in self.entries)


def agreement_matrix(names: list[str], dtypes: list[str], device: str) -> Matrix:
    """Check each implementation in ``names`` on every case of ``agreement_cases`` for each dtype.

    An implementation that raises counts as disagreeing on that case; one that cannot run on
    ``device`` is "n/a" unless it is ``broken`` (its build failed), which is a failure.  Declared
    exceptions are kept beside the verdicts, so the output says what "ok" was held to.
    """
    from relu2.measure.inputs import agreement_cases, dtype_of
    from relu2.measure.registry import get

    entries: list[MatrixEntry] = []
    not_here: dict[str, str] = {}
    broken: dict[str, str] = {}
    declared: dict[str, tuple[str, ...]] = {}
    for name in names:
        impl = get(name)
        if impl.declared:
            declared[name] = impl.declared
        if not impl.supports(device):
            (broken if impl.broken else not_here)[name] = impl.why_not(device)
            entries += [MatrixEntry(name, d, "FAIL" if impl.broken else "n/a") for d in dtypes]
            continue
        for dtype in dtypes:
            failures = []
            for case in agreement_cases(dtype_of(dtype), device):
                try:
                    check_agreement(impl, case.x)
                except Exception as e:  # AgreementError, or the implementation crashed
                    failures.append(f"[{case.label}]: {e}")
            entries.append(MatrixEntry(name, dtype, f"FAIL({len(failures)})" if failures else OK, tuple(failures)))
    return Matrix(device, tuple(dtypes), tuple(entries), not_here, broken, declared)
