"""Moved to relu2.measure.inputs: import it from there (this path goes in a later release)."""

import sys
import warnings

from relu2.measure import inputs as _moved

warnings.warn("inputs moved: import relu2.measure.inputs", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
