"""The interface between the instrument and the implementations it measures (interface 1).

The instrument (this ``relu2`` package: contract, timers, isolation, suites, gate) is one ruler for
every commit it measures; the implementations come from the package under test, found through
entry points in the group ``relu2.implementations``.  That group *is* interface 1: a distribution
that declares entry points in it speaks this module's ``Implementation``, and a commit whose
``pyproject.toml`` declares none predates the interface and is not measured (``relu2 asv run``
records why).  A later, incompatible interface gets a group of its own; this one only grows fields
with defaults.

An entry point names one of:

* an ``Implementation``;
* a callable with no arguments returning one (called on first use: building a kernel waits until
  the implementation is asked for);
* a callable returning a list of them (one entry point for several implementations).

The entry point's name should be the implementation's; ``relu2 sweep --impl NAME`` and the asv
suites find it by that name without loading anything.

Torch-free on purpose: a provider imports this module cheaply, and the instrument's listing of
names never pays for torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Iterable, Mapping

INTERFACE_VERSION = 1
ENTRY_POINT_GROUP = "relu2.implementations"


@dataclass(frozen=True)
class Compile:
    """An implementation that is ``torch.compile`` of a function: the instrument compiles ``fn`` with
    these arguments, guards it against silently falling back to eager, warms it up and fingerprints
    the kernel that serves each input (``relu2.measure.compiled``).

    ``options`` go to inductor as ``torch.compile`` passes them (config overrides for this path
    alone, e.g. ``{"triton.autotune_pointwise": False}``); ``mark_dim0`` marks dim 0 dynamic before
    every call (vLLM's ``dynamic_arg_dims``); ``warmup_tokens`` is the token count a dynamic-shape
    path is first called at for each width (the generated kernel is specialised on its first shape).
    """

    dynamic: bool | None
    fullgraph: bool = False
    mark_dim0: bool = False
    options: Mapping[str, Any] | None = None
    warmup_tokens: int | None = None

    def describe(self) -> str:
        call = f"torch.compile(fn, dynamic={self.dynamic}"
        call += ", fullgraph=True" if self.fullgraph else ""
        call += f", options={dict(self.options)}" if self.options else ""
        call += ")" + (" + mark_dynamic(x, 0) per call" if self.mark_dim0 else "")
        if self.warmup_tokens is not None:
            call += f"; first called at {self.warmup_tokens} token{'s' if self.warmup_tokens > 1 else ''}"
        return call


@dataclass(frozen=True)
class Kernel:
    """The kernel an implementation of its own runs, for ``relu2 inspect``: its ``name``, ``language``
    ("cuda", "cpp" or "triton"), a ``launch`` configuration, the folder of its ``source``, and the
    ``binary`` (a shared library) whose SASS shows the width of every load and store.  A Triton
    kernel's PTX is read from the Triton cache of the call."""

    name: str
    language: str
    launch: str = ""
    source: str = ""
    binary: str = ""


def device_kind(device: Any) -> str:
    """"cuda" or "cpu" (or another type) from a torch.device, "cuda:1" or "cpu"."""
    return getattr(device, "type", None) or str(device).split(":", 1)[0]


def why_not(available: bool, reason: str, devices: Iterable[str], device: Any) -> str:
    """Why an implementation cannot run on ``device``, or "" when it can."""
    if not available:
        return reason
    devices = tuple(devices)
    kind = device_kind(device)
    return "" if kind in devices else f"runs on {', '.join(devices)} only, not {kind}"


@dataclass(frozen=True)
class Implementation:
    """One way of computing relu² (or a reference the instrument times beside them).

    ``fn(x)`` returns relu²(x) as a new tensor of x's shape, dtype and device (with ``compile`` set,
    ``fn`` is the function compiled; ``None`` then means the eager reference).  ``devices`` are the
    device types it accepts.

    Unavailable: absent for a reason outside the project (no CUDA, no toolkit: its cells are
    skipped) or ``broken`` (the project's own kernel did not build: its cells fail, so a broken commit
    cannot pass as "n/a").

    Declared exceptions to the bitwise contract (``relu2.measure.agreement``), never silent ones:
    ``nan_to_zero``: NaN in gives +0 out (vLLM's CUDA kernel); it is held bitwise everywhere else.
    ``writes_input``: ``fn`` overwrites its input (relu in place); it gets inputs of its own.

    ``prepare(dtype, shape, device)`` runs untimed before a cell's agreement check;
    ``fingerprint(x)`` names the kernel that serves ``x`` (a hash; "" when there is none);
    ``kernel(x)`` says what that kernel is (a ``Kernel``, for ``relu2 inspect``; None: torch's own).
    ``is_relu2`` is False only for the instrument's ``copy`` roofline.
    ``in_default_sweep`` False leaves it out of a ``relu2 sweep`` that names no implementation (a
    variant measured side by side in its own suite); set it on the entry point's factory too
    (``factory.in_default_sweep = False``), so the sweep's plan reads it without building anything.
    """

    name: str
    fn: Callable[..., Any] | None
    available: bool = True
    reason: str = ""
    devices: tuple[str, ...] = ("cpu", "cuda")
    description: str = ""
    broken: bool = False
    compile: Compile | None = None
    nan_to_zero: bool = False
    writes_input: bool = False
    prepare: Callable[..., None] | None = None
    fingerprint: Callable[..., str] | None = None
    is_relu2: bool = True
    kernel: Callable[..., Kernel] | None = None
    in_default_sweep: bool = True

    def supports(self, device: Any) -> bool:
        """True when this implementation is available and accepts tensors on ``device``."""
        return not self.why_not(device)

    def why_not(self, device: Any) -> str:
        """The reason ``supports(device)`` is False, or "" when it is True."""
        return why_not(self.available, self.reason, self.devices, device)

    @property
    def declared(self) -> tuple[str, ...]:
        """The declared exceptions, as ``relu2 check`` shows them."""
        return tuple(label for label, on in (("NaN -> +0", self.nan_to_zero), ("writes its input", self.writes_input))
                     if on)


def unavailable(name: str, reason: str, *, broken: bool = False, devices: tuple[str, ...] = ("cpu", "cuda")
                ) -> Implementation:
    """An implementation that cannot run here, and says why."""
    return Implementation(name, _Refuse(name, reason), available=False, reason=reason, broken=broken,
                          devices=devices)


class _Refuse:
    """The fn of an implementation that cannot run: raises with the reason (picklable, unlike a closure)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    def __call__(self, x: Any) -> Any:
        raise RuntimeError(f"implementation {self.name!r} is unavailable: {self.reason}")


def provided(obj: Any, source: str) -> list[Implementation]:
    """What an entry point gives, as a list of Implementations; TypeError naming ``source`` otherwise.

    ``obj`` is an Implementation, a list of them, or a callable returning either (called here).
    """
    if callable(obj) and not isinstance(obj, Implementation):
        obj = obj()
    items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    for item in items:
        if not isinstance(item, Implementation):
            raise TypeError(f"{source} gave {type(item).__name__}, not a relu2.vocab.interface.Implementation")
    return items


# --- discovery ------------------------------------------------------------------------------------

ENV_MEASURED = "RELU2_MEASURED"  # a distribution name: only its entry points are the implementations under test


def entry_points(measured: str | None = None) -> list:
    """The entry points of interface 1 (``importlib.metadata.EntryPoint``), unloaded, one per name.

    ``measured`` (default ``$RELU2_MEASURED``) keeps only those of that distribution: under asv, the
    package of the commit being measured, whatever else the environment can see.
    """
    measured = os.environ.get(ENV_MEASURED, "") if measured is None else measured
    found: dict[str, Any] = {}
    for dist in metadata.distributions():
        if measured and _normal(dist.metadata["Name"] or "") != _normal(measured):
            continue
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                found.setdefault(ep.name, ep)
    return list(found.values())


def declares_interface(measured: str) -> bool:
    """Whether the installed distribution ``measured`` declares any entry point of interface 1."""
    return bool(entry_points(measured))


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
