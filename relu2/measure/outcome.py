"""What measuring a cell gives, as plain data: each mode's Outcome and the cell's CellResult.

They cross from a worker process (``relu2.measure.cell`` measures there) to the process that runs the
sweep or a round, which reads them and never touches a tensor: so this module imports no torch, and
neither does a round's coordinating process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from relu2.measure.timing import Timing
from relu2.vocab.schema import Cell


@dataclass(frozen=True)
class Outcome:
    """One figure of a cell: its Timing when status is "ok", else the reason it has none."""

    status: str
    reason: str = ""
    timing: Timing | None = None

    @property
    def median_s(self) -> float:
        return self.timing.median_s if self.timing else float("nan")


@dataclass
class CellResult:
    """Everything measured for one cell; plain data, so it crosses from a worker process to the sweep.

    ``status`` is the cell's own: "ok" once it passed the agreement check (or needs none, like
    ``copy``), "failed" when it disagreed or the check raised, "skipped" when it cannot run here.
    ``outcomes`` has one Outcome per mode; a mode can fail on its own (say, the implementation
    cannot be captured in a CUDA graph) while the others are timed.  ``peak_bytes`` is the GPU
    memory one call allocates at its peak (None off CUDA or when not measured).
    """

    cell: Cell
    status: str
    reason: str = ""
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    peak_bytes: int | None = None
    kernel: str = ""  # the implementation's fingerprint of what ran for this input
    # Where the cell's time went, by phase ("prepare", "agreement", "input", "fingerprint", each mode,
    # "peak memory", "cleanup"; a worker pool adds "transfer", the rest of its round trip): what a
    # commit's measurement costs, and where rounds are paid for.
    seconds: dict[str, float] = field(default_factory=dict)

    def median(self, mode: str) -> float:
        """The mode's median in seconds, NaN when it was not timed."""
        outcome = self.outcomes.get(mode)
        return outcome.median_s if outcome else float("nan")


def all_modes(cell: Cell, modes: Sequence[str], status: str, reason: str) -> CellResult:
    """A cell with no figure: every mode gets ``status`` and ``reason``."""
    return CellResult(cell, status, reason, {mode: Outcome(status, reason) for mode in modes})


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(e)}"
