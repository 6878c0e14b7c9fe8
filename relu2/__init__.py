"""relu2-bench's instrument for relu²(x) = relu(x)²: the contract implementations must meet, how they are
timed and judged, and the registry that finds them (the implementations under test live in
``relu2_impls`` and in other packages, behind ``relu2.vocab.interface``).

Importing this package is cheap and never imports torch: the public names below are loaded on first
use (PEP 562), and nothing is built and torch.compile is not invoked until an implementation is first
asked for.  ``relu2.vocab.schema`` holds the vocabulary (modes, columns, grid, styles) without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "AgreementError": "relu2.measure.agreement",
    "check_agreement": "relu2.measure.agreement",
    "compare_bitwise": "relu2.measure.agreement",
    "CompileFallbackError": "relu2.measure.compiled",
    "Implementation": "relu2.measure.registry",
    "get": "relu2.measure.registry",
    "implementations": "relu2.measure.registry",
    "register": "relu2.measure.registry",
    "relu_squared": "relu2.measure.registry",
    "unregister": "relu2.measure.registry",
    "relu_squared_reference": "relu2.measure.reference",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'relu2' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
