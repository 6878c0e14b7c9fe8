"""Moved to relu2.measure.compiled: import it from there (this path goes in a later release)."""

import sys
import warnings

from relu2.measure import compiled as _moved

warnings.warn("compiled moved: import relu2.measure.compiled", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
