"""The one registry of relu² implementations: built-ins, user registrations and entry points.

Built-ins are registered as factories and resolved on first use (``get(name)`` resolves that one,
``implementations()`` all), so ``import relu2`` stays cheap and never builds anything.  An implementation that cannot run
here is still listed, with ``available=False`` and the reason.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Mapping

import torch

from relu2.reference import relu_squared_reference
from relu2.schema import ENTRY_POINT_GROUP, ROOFLINE, why_not


Fn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Implementation:
    """One way of computing relu², or a reference that is timed beside them.

    ``devices`` are the device types the implementation accepts ("cpu", "cuda").
    ``is_relu2`` is False for the ``copy`` roofline reference, which is excluded from agreement.
    An unavailable implementation is either absent here for a reason outside the project (no CUDA,
    no toolkit: its cells are skipped) or ``broken`` (the project's own kernel did not build: its
    cells fail, so a broken commit cannot pass as "n/a").
    """

    name: str
    fn: Fn
    available: bool = True
    reason: str = ""
    devices: tuple[str, ...] = ("cpu", "cuda")
    is_relu2: bool = True
    description: str = ""
    broken: bool = False
    # Brings the implementation to the state it is measured in for an input of (dtype, shape) on a
    # device, untimed, before its agreement check (a dynamic-shape compiled path meets its warm-up
    # shape first).
    prepare: Callable[[torch.dtype, tuple[int, ...], str], None] | None = None
    # What ran for an input: a hash of the generated or built kernel ("" when there is none).
    fingerprint: Callable[[torch.Tensor], str] | None = None

    def supports(self, device: str | torch.device) -> bool:
        """True when this implementation is available and accepts tensors on ``device``."""
        return self.available and torch.device(device).type in self.devices

    def why_not(self, device: str | torch.device) -> str:
        """The reason ``supports(device)`` is False, or "" when it is True."""
        return why_not(self.available, self.reason, self.devices, torch.device(device).type)


class _Refuse:
    """The fn of an implementation that cannot run: raises with the reason (picklable, unlike a closure)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"implementation {self.name!r} is unavailable: {self.reason}")


def _unavailable(name: str, reason: str, **kw) -> Implementation:
    return Implementation(name=name, fn=_Refuse(name, reason), available=False, reason=reason, **kw)


# --- built-ins -------------------------------------------------------------------------------


def _eager() -> Implementation:
    return Implementation("eager", relu_squared_reference, description="torch.square(F.relu(x)): two eager kernels")


def _compiled(name: str) -> Callable[[], Implementation]:
    """The factory of a torch.compile'd built-in (relu2.compiled says how each is compiled and why)."""

    def make() -> Implementation:
        from relu2.compiled import SPECS, Compiled

        path = Compiled(name, SPECS[name])
        return Implementation(name, path, description=SPECS[name].description, prepare=path.prepare,
                              fingerprint=path.fingerprint)

    return make


def _fused() -> Implementation:
    from relu2 import fused

    try:
        fused.load()
    except Exception as e:  # a failed build carries the compiler's message; the project's kernel is broken
        return _unavailable("fused", f"the fused extension did not build: {e}", broken=True)
    devices = ("cpu", "cuda") if fused.has_cuda() else ("cpu",)
    return Implementation("fused", fused.relu_squared, devices=devices,
                          description="csrc/ kernel via torch.library (CUDA kernel and C++ CPU twin)",
                          fingerprint=lambda x: fused.build_key())


def _triton() -> Implementation:
    if not torch.cuda.is_available():
        return _unavailable("triton", "needs CUDA: torch.cuda.is_available() is False", devices=("cuda",))
    try:
        from relu2.triton_kernel import relu_squared_triton
    except Exception as e:  # triton missing or too old
        return _unavailable("triton", f"triton did not import: {e}", devices=("cuda",))
    return Implementation("triton", relu_squared_triton, devices=("cuda",),
                          description="hand-written Triton kernel (Liger-style)", fingerprint=_source_hash(relu_squared_triton))


def _source_hash(fn: Callable) -> Callable[[torch.Tensor], str]:
    """A fingerprint for a kernel written in Python: the hash of the module that holds it."""
    import hashlib
    import inspect

    digest = hashlib.sha256(inspect.getsource(inspect.getmodule(fn)).encode()).hexdigest()[:16]
    return lambda x: digest


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


def _copy() -> Implementation:
    return Implementation(ROOFLINE, copy_bytes, is_relu2=False,
                          description="elementwise device copy of the same bytes: the roofline reference, not relu²")


BUILTINS: dict[str, Callable[[], Implementation]] = {
    "eager": _eager,
    "compile": _compiled("compile"),
    "compile_dynamic": _compiled("compile_dynamic"),
    "compile_dim0": _compiled("compile_dim0"),
    "fused": _fused,
    "triton": _triton,
    "copy": _copy,
    "compile_dynamic_1tok": _compiled("compile_dynamic_1tok"),
    "compile_dim0_1tok": _compiled("compile_dim0_1tok"),
}

# name -> resolved Implementation or a factory not yet called.  The registry is the package's one
# piece of global state.
_registry: dict[str, Implementation | Callable[[], Implementation]] = dict(BUILTINS)
_entry_points_loaded = False
_registered_here: set[str] = set()


def register(
    name: str,
    fn: Fn,
    *,
    devices: tuple[str, ...] = ("cpu", "cuda"),
    description: str = "",
    replace: bool = False,
) -> Implementation:
    """Add an implementation to the registry; it is then checked and timed like the built-ins.

    ``fn`` takes a tensor and returns relu² of it as a new tensor.  Registering an existing name
    raises unless ``replace=True``.
    """
    if not name or not name.isidentifier():
        raise ValueError(f"implementation name must be an identifier, got {name!r}")
    if name in _registry and not replace:
        raise ValueError(f"implementation {name!r} is already registered (pass replace=True to override)")
    if not callable(fn):
        raise TypeError(f"fn for {name!r} must be callable, got {type(fn).__name__}")
    impl = Implementation(name, fn, devices=tuple(devices), description=description)
    _registry[name] = impl
    _registered_here.add(name)
    return impl


def unregister(name: str) -> None:
    """Remove a user-registered implementation (built-ins stay)."""
    if name in BUILTINS:
        raise ValueError(f"{name!r} is a built-in implementation")
    _registry.pop(name, None)
    _registered_here.discard(name)


def registered_here() -> dict[str, Implementation]:
    """The implementations ``register`` added in this process (not built-ins, not entry points).

    A sweep's worker processes start fresh: these are sent to them (pickled), the others they
    find themselves.
    """
    return {name: _registry[name] for name in _registered_here if isinstance(_registry.get(name), Implementation)}


def _load_entry_points() -> None:
    """Entry points in the group ``relu2.implementations`` name an Implementation or a factory of one."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _registry:
            continue
        try:
            _registry[ep.name] = ep.load()
        except Exception:
            reason = f"entry point {ep.value} failed to load: {traceback.format_exc(limit=1).strip()}"
            _registry[ep.name] = _unavailable(ep.name, reason)


def _resolve(name: str) -> Implementation:
    entry = _registry[name]
    if isinstance(entry, Implementation):
        return entry
    try:
        impl = entry()
    except Exception as e:  # a broken implementation never breaks the registry
        impl = _unavailable(name, f"{type(e).__name__}: {e}")
    if not isinstance(impl, Implementation):
        impl = _unavailable(name, f"factory returned {type(impl).__name__}, not an Implementation")
    _registry[name] = impl
    return impl


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
