"""asv's own command line, read as asv reads it but without running asv: what an option names (a
folder it will empty, a machine) is checked against asv's parser, abbreviations and all."""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Sequence

from relu2.vocab.errors import UsageError


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``asv ARGV...`` parsed by asv's parser; UsageError in one line, asv's own, for what it rejects."""
    from asv.commands import make_argparser

    parser, _ = make_argparser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return parser.parse_args(list(argv))
    except SystemExit:
        lines = [ln for ln in said.getvalue().splitlines() if ln.strip()]
        raise UsageError(f"asv {argv[0]}: {lines[-1].split(': error: ', 1)[-1] if lines else 'bad options'}") from None
