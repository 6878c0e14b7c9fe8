"""Moved to relu2.vocab.schema; this path stays, for the implementations of every commit, plugins and the
asv suites (also under older instruments)."""

import sys

from relu2.vocab import schema as _moved

sys.modules[__name__] = _moved
