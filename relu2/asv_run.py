"""Moved to relu2.runs.asv_run; this path stays, for the implementations of every commit, plugins and the
asv suites (also under older instruments)."""

import sys

from relu2.runs import asv_run as _moved

sys.modules[__name__] = _moved
