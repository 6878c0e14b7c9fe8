"""relu2-bench: implementations of relu²(x) = relu(x)², the contract they must meet, and how they are timed.

Importing this package is cheap: nothing is built and torch.compile is not invoked until an
implementation is first asked for.
"""

from relu2.agreement import AgreementError, check_agreement, compare_bitwise
from relu2.implementations import (
    CompileFallbackError,
    Implementation,
    get,
    implementations,
    register,
    relu_squared,
    unregister,
)
from relu2.reference import relu_squared_reference

__all__ = [
    "AgreementError",
    "CompileFallbackError",
    "Implementation",
    "check_agreement",
    "compare_bitwise",
    "get",
    "implementations",
    "register",
    "relu_squared",
    "relu_squared_reference",
    "unregister",
]
__version__ = "0.1.0"
