"""Moved to relu2.measure.reference: import it from there (this path goes in a later release)."""

import sys
import warnings

from relu2.measure import reference as _moved

warnings.warn("reference moved: import relu2.measure.reference", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
