"""What the instrument refuses, in one family: every error a user's input can cause derives from
``Refused``, so the command line turns exactly these (and no bug) into one line and exit 2.

Each message is one line naming the thing refused (a file, an option, a commit) and, where there is
one, the way out.
"""

from __future__ import annotations


class Refused(Exception):
    """Input refused at the boundary: the command says why in one line and exits 2, nothing written."""


class UsageError(Refused, ValueError):
    """Input this machine cannot serve (an option, a device that is not here, a size that does not fit)."""


class DeviceError(UsageError):
    """The device asked for is not here."""


class ResultsError(Refused):
    """An asv results folder, or a file in it, that cannot be read; the message names the file."""


class CsvError(Refused, ValueError):
    """A file that is not a relu2 results CSV; the message names the file (and the line)."""


class WriteError(Refused, OSError):
    """A result file that cannot be written where asked; the message names the path."""
