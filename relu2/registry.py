"""Moved to relu2.measure.registry: import it from there (this path goes in a later release)."""

import sys
import warnings

from relu2.measure import registry as _moved

warnings.warn("registry moved: import relu2.measure.registry", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
