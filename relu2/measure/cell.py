"""Measuring one cell in this process: bitwise agreement on a fresh input first, then each mode's timing.

Never raises for a cell: an implementation that disagrees is recorded "failed" and never timed; one
that cannot run here, or runs out of memory, is "skipped"; any other error fails that cell (or that
mode) with the reason.  This is what a sweep worker runs for each cell it is sent (``relu2.measure.isolation``).
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import Callable, Sequence

import torch

from relu2.measure.agreement import AgreementError, check_agreement
from relu2.measure.inputs import dtype_of, random_input
from relu2.measure.outcome import CellResult, Outcome, all_modes, describe, first_line
from relu2.measure.registry import Implementation, get
from relu2.measure.timing import Budget, peak_memory_bytes, time_fn
from relu2.vocab.schema import FAILED, OK, SKIPPED, Cell


def measure_cell(cell: Cell, modes: Sequence[str], device: str, budget: Budget | None = None) -> CellResult:
    """Agreement first on a fresh input, then each mode's timing; every failure becomes a recorded status."""
    try:
        impl = get(cell.impl)
    except KeyError as e:
        return all_modes(cell, modes, SKIPPED, str(e.args[0]))
    if impl.broken:
        return all_modes(cell, modes, FAILED, impl.reason)
    if not impl.supports(device):
        return all_modes(cell, modes, SKIPPED, impl.why_not(device))
    seconds: dict[str, float] = {}
    try:
        x, kernel = prepare_and_check(impl, cell, device, seconds)
    except AgreementError as e:
        return all_modes(cell, modes, FAILED, str(e))
    except torch.OutOfMemoryError as e:
        free_memory(device)
        return all_modes(cell, modes, SKIPPED, f"out of memory: {first_line(e)}")
    except Exception as e:
        free_memory(device)
        return all_modes(cell, modes, FAILED, f"agreement check raised {describe(e)}")

    result = CellResult(cell, OK, kernel=kernel, seconds=seconds)
    fresh = None if not impl.writes_input else (lambda: fresh_input(cell, device))
    for i, mode in enumerate(modes):
        # A writes_input implementation leaves relu(x) where x was: each mode's call series (and the
        # peak-memory call below) starts from a fresh input of its own, made once the spent one is
        # dropped, so no series inherits another's.  Within a series the calls after the first see
        # relu(x): the same work for an elementwise kernel.
        if fresh is not None and i > 0:
            x = None
        with _phase(seconds, mode):
            result.outcomes[mode] = _time_mode(impl, x, mode, budget, device, fresh)
    try:
        if fresh is not None:
            x = None
            x = fresh()
        with _phase(seconds, "peak memory"):
            result.peak_bytes = peak_memory_bytes(impl.fn, x)
    except Exception:  # a side figure; the timings stand without it
        result.peak_bytes = None
    del x
    with _phase(seconds, "cleanup"):
        free_memory(device, collect=False)
    return result


def prepare_and_check(impl: Implementation, cell: Cell, device: str,
                      seconds: dict[str, float] | None = None) -> tuple[torch.Tensor, str]:
    """What every figure of a cell is measured after: the implementation's warm-up (``prepare``),
    bitwise agreement on a fresh input (AgreementError when it disagrees), then the input to time
    and the fingerprint of what runs on it.  ``seconds`` gets each phase's wall time.  ``relu2
    inspect`` takes the same steps, so what it shows is what was measured."""
    seconds = {} if seconds is None else seconds
    if impl.prepare is not None:  # e.g. a dynamic-shape compiled path meets its warm-up shape first
        with _phase(seconds, "prepare"):
            impl.prepare(dtype_of(cell.dtype), cell.shape, device)
    # The agreement input and the timed input are two fresh tensors, never one: an implementation
    # that writes its input (writes_input, declared; check_agreement also hands it a clone) cannot
    # pass its changed input on to the timers, and each cell makes its own.
    if impl.is_relu2:
        with _phase(seconds, "agreement"):  # a torch.compile'd implementation compiles here, untimed
            check_agreement(impl, fresh_input(cell, device))
    with _phase(seconds, "input"):
        x = fresh_input(cell, device)
    with _phase(seconds, "fingerprint"):
        kernel = impl.fingerprint(x) if impl.fingerprint is not None else ""
    return x, kernel


@contextmanager
def _phase(seconds: dict[str, float], name: str):
    """Add the wall time of the block to ``seconds[name]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


def fresh_input(cell: Cell, device: str) -> torch.Tensor:
    """A new random input of the cell's dtype and shape (the grid's mix of values, ``relu2.measure.inputs``)."""
    return random_input(cell.numel, dtype_of(cell.dtype), device).view(cell.shape)


def _time_mode(impl: Implementation, x: torch.Tensor | None, mode: str, budget: Budget | None, device: str,
               fresh: Callable[[], torch.Tensor] | None = None) -> Outcome:
    """Time one mode on ``x``, or, when ``x`` is None, on a fresh input from ``fresh()`` made here (so a
    failure to make it is this mode's outcome, like any other)."""
    try:
        if x is None:
            assert fresh is not None
            x = fresh()
        return Outcome(OK, timing=time_fn(impl.fn, x, mode, budget))
    except torch.OutOfMemoryError as e:
        free_memory(device)
        return Outcome(SKIPPED, f"out of memory while timing {mode}: {first_line(e)}")
    except Exception as e:
        free_memory(device)
        return Outcome(FAILED, f"timing {mode} raised {describe(e)}")


def free_memory(device: str, collect: bool = True) -> None:
    """Return cached GPU memory between cells, so one cell's buffers never crowd out the next."""
    if collect:
        gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
