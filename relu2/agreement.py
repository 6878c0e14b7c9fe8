"""Moved to relu2.measure.agreement: import it from there (this path goes in a later release)."""

import sys
import warnings

from relu2.measure import agreement as _moved

warnings.warn("agreement moved: import relu2.measure.agreement", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
