"""The one registry of relu² implementations: the instrument's references, the implementations under
test (entry points of interface 1, ``relu2.vocab.interface``), and registrations made in this process.

The references belong to the instrument and are the same for every commit measured: ``eager`` (the
definition of correct, two eager kernels), ``compile`` (torch.compile of it, static shapes: the
compiler's baseline) and ``copy`` (the roofline).  Everything else comes from the package under
test: this repository's ``relu2_impls`` (the fused kernel, the Triton kernel, vLLM's compiled paths),
or any other distribution that declares entry points in the group ``relu2.implementations``.

Nothing is built or loaded until asked for: ``names()`` lists entry points without loading them,
``get(name)`` resolves that one, ``implementations()`` all.  An implementation that cannot run here
is still listed, with ``available=False`` and the reason; one whose entry point fails to load is
listed the same way, with the traceback's last line.
"""

from __future__ import annotations

import traceback
from dataclasses import replace
from typing import Callable, Mapping

import torch

from relu2.measure.reference import relu_squared_reference
from relu2.vocab.interface import Compile, Implementation, entry_points, provided, unavailable
from relu2.vocab.schema import ROOFLINE

__all__ = ["Implementation", "get", "implementations", "in_default_sweep", "names", "register", "registered_here", "relu_squared",
           "unregister", "copy_bytes"]

Fn = Callable[[torch.Tensor], torch.Tensor]


# --- the instrument's references ------------------------------------------------------------------

_SAME_WIDTH_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def copy_bytes(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` made by an elementwise kernel: the bytes relu² moves, and nothing else.

    Not ``torch.clone``: a contiguous clone is a cudaMemcpy, and inside a CUDA graph (how ``hot`` and
    ``cold`` are timed) that becomes a copy-engine memcpy node, measured on the H200 at 2.76 TB/s
    against 4.16 TB/s for the same copy launched eagerly.  OR-ing the integer view with 0 runs torch's
    ordinary vectorised elementwise kernel in both settings and leaves every bit as it was.
    """
    as_int = x.view(_SAME_WIDTH_INT[x.element_size()])
    return torch.bitwise_or(as_int, 0).view(x.dtype)


# Static shapes, one kernel per shape; inductor's pointwise autotuning (a timing coin toss at L2
# sizes, docs/methodology.md) off, so every run generates inductor's heuristic configuration.
STATIC_COMPILE = Compile(dynamic=False, fullgraph=True, options={"triton.autotune_pointwise": False})

REFERENCES: dict[str, Callable[[], Implementation]] = {
    "eager": lambda: Implementation("eager", relu_squared_reference,
                                    description="torch.square(F.relu(x)): two eager kernels"),
    "compile": lambda: Implementation("compile", relu_squared_reference, compile=STATIC_COMPILE,
                                      description="static torch.compile of eager: " + STATIC_COMPILE.describe()),
    ROOFLINE: lambda: Implementation(ROOFLINE, copy_bytes, is_relu2=False,
                                     description="elementwise device copy of the same bytes: the roofline "
                                                 "reference, not relu²"),
}


# --- the registry ----------------------------------------------------------------------------------

# name -> resolved Implementation, or a loader not yet called.  The package's one piece of global state.
_registry: dict[str, Implementation | Callable[[], Implementation]] = dict(REFERENCES)
_entry_points_loaded = False
_registered_here: set[str] = set()
_resolved: set[str] = set()


def register(
    name: str,
    fn: Fn,
    *,
    devices: tuple[str, ...] = ("cpu", "cuda"),
    description: str = "",
    replace: bool = False,
    nan_to_zero: bool = False,
    writes_input: bool = False,
) -> Implementation:
    """Add an implementation to the registry; it is then checked and timed like the others.

    ``fn`` takes a tensor and returns relu² of it as a new tensor.  Registering an existing name
    raises unless ``replace=True``.  ``nan_to_zero`` and ``writes_input`` declare exceptions to the
    contract (``relu2.vocab.interface.Implementation``).
    """
    if not name or not name.isidentifier():
        raise ValueError(f"implementation name must be an identifier, got {name!r}")
    if name in _registry and not replace:
        raise ValueError(f"implementation {name!r} is already registered (pass replace=True to override)")
    if not callable(fn):
        raise TypeError(f"fn for {name!r} must be callable, got {type(fn).__name__}")
    impl = Implementation(name, fn, devices=tuple(devices), description=description, nan_to_zero=nan_to_zero,
                          writes_input=writes_input)
    _registry[name] = impl
    _registered_here.add(name)
    _resolved.discard(name)
    return impl


def unregister(name: str) -> None:
    """Remove a user-registered implementation (the references stay)."""
    if name in REFERENCES:
        raise ValueError(f"{name!r} is one of the instrument's references")
    _registry.pop(name, None)
    _registered_here.discard(name)
    _resolved.discard(name)


def registered_here() -> dict[str, Implementation]:
    """The implementations ``register`` added in this process (not references, not entry points).

    A sweep's worker processes start fresh: these are sent to them (pickled), the others they
    find themselves.
    """
    return {name: _registry[name] for name in _registered_here if isinstance(_registry.get(name), Implementation)}


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points():
        if ep.name not in _registry:
            _registry[ep.name] = _loader(ep)


def _loader(ep) -> Callable[[], Implementation]:
    """Load ``ep`` on first use; every implementation it provides joins the registry."""

    def load() -> Implementation:
        source = f"entry point {ep.name} = {ep.value}"
        try:
            items = provided(ep.load(), source)
        except Exception:  # a broken provider never breaks the registry
            return unavailable(ep.name, f"{source} failed to load: {traceback.format_exc(limit=1).strip()}")
        for item in items:
            if item.name != ep.name and item.name not in _registry:
                _registry[item.name] = item
        mine = next((item for item in items if item.name == ep.name), None)
        return mine or unavailable(ep.name, f"{source} provides {', '.join(i.name for i in items) or 'nothing'}, "
                                            f"not {ep.name!r}")

    return load


def _ready(impl: Implementation) -> Implementation:
    """A compiled path becomes the instrument's guarded, warmed-up, fingerprinted call."""
    if impl.compile is None or not impl.available:
        return impl
    from relu2.measure.compiled import Compiled

    path = Compiled(impl.name, impl.compile, impl.fn or relu_squared_reference)
    return replace(impl, fn=path, prepare=path.prepare, fingerprint=path.fingerprint,
                   description=impl.description or impl.compile.describe())


def _resolve(name: str) -> Implementation:
    entry = _registry[name]
    if name in _resolved:
        return entry
    if not isinstance(entry, Implementation):
        try:
            entry = entry()
        except Exception as e:  # a broken implementation never breaks the registry
            entry = unavailable(name, f"{type(e).__name__}: {e}")
        if not isinstance(entry, Implementation):
            entry = unavailable(name, f"its factory returned {type(entry).__name__}, not an Implementation")
    try:
        entry = _ready(entry)
    except Exception as e:  # noqa: BLE001  torch.compile itself unusable here
        entry = unavailable(name, f"torch.compile could not be set up: {type(e).__name__}: {e}", broken=True)
    _registry[name] = entry
    _resolved.add(name)
    return entry


def in_default_sweep(name: str) -> bool:
    """Whether ``name`` is swept when no implementation is named (``Implementation.in_default_sweep``):
    read from a resolved implementation, else from its entry point's factory, which is loaded (its
    module imported), never called: nothing is built to plan a sweep."""
    _load_entry_points()
    entry = _registry.get(name)
    if isinstance(entry, Implementation):
        return entry.in_default_sweep
    ep = next((ep for ep in entry_points() if ep.name == name), None)
    try:
        return bool(getattr(ep.load(), "in_default_sweep", True)) if ep is not None else True
    except Exception:  # noqa: BLE001  a provider that does not load is swept, and fails there with the reason
        return True


def names() -> list[str]:
    """Every registered implementation's name, without resolving (or building) any of them."""
    _load_entry_points()
    return list(_registry)


def implementations() -> Mapping[str, Implementation]:
    """Every registered implementation by name, available or not; resolves (and builds) lazily."""
    _load_entry_points()
    return {name: _resolve(name) for name in list(_registry)}


def get(name: str) -> Implementation:
    """The implementation called ``name``; KeyError lists the known names."""
    _load_entry_points()
    if name not in _registry:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(_registry)}")
    return _resolve(name)


def relu_squared(x: torch.Tensor, impl: str = "fused") -> torch.Tensor:
    """relu²(x) computed by the implementation called ``impl``."""
    chosen = get(impl)
    if not chosen.is_relu2:
        raise ValueError(f"implementation {impl!r} is a reference ({chosen.description}), not relu²")
    if not chosen.available:
        raise RuntimeError(f"implementation {impl!r} is unavailable: {chosen.reason}")
    if not chosen.supports(x.device):
        raise RuntimeError(f"implementation {impl!r} cannot run on {x.device}: {chosen.why_not(x.device)}")
    return chosen.fn(x)
