"""Inputs for the agreement contract: fresh random normals mixed with special values, odd sizes, views."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from relu2.vocab import schema


def dtype_of(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from itself or its name ("bfloat16", "torch.bfloat16")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"not a torch dtype: {dtype!r}")
    return found


def dtype_name(dtype: torch.dtype | str) -> str:
    """The short name of a dtype, as results store it: "bfloat16"."""
    return str(dtype_of(dtype)).removeprefix("torch.")


DTYPES: tuple[torch.dtype, ...] = tuple(dtype_of(name) for name in schema.DTYPES)


def special_values(dtype: torch.dtype) -> torch.Tensor:
    """Every value class the contract names, on the CPU: NaN, ±inf, ±0, subnormals, squares that overflow."""
    info = torch.finfo(dtype)
    tiny_sub = info.smallest_normal * info.eps  # the smallest positive subnormal
    big = float(info.max) ** 0.5 * 1.5  # finite, but its square overflows to inf
    values = [
        float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0,
        tiny_sub, -tiny_sub, info.smallest_normal / 2, -info.smallest_normal / 2,
        info.smallest_normal, -info.smallest_normal, info.max, -info.max, big, -big,
        1.0, -1.0, info.eps, 1.0 + info.eps, 0.5, 3.0,
    ]
    return torch.tensor(values, dtype=torch.float64).to(dtype)


def random_input(
    numel: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    special_fraction: float = 0.05,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A flat tensor of standard normals with ``special_fraction`` of its entries replaced by special values.

    Fresh on every call unless a seeded ``generator`` is given. Never all zeros: zeros hide
    unwritten outputs.
    """
    x = torch.randn(numel, dtype=torch.float32, device=device, generator=generator).to(dtype)
    n_special = int(numel * special_fraction)
    if n_special:
        specials = special_values(dtype).to(device)
        where = torch.randint(0, numel, (n_special,), device=device, generator=generator)
        which = torch.randint(0, specials.numel(), (n_special,), device=device, generator=generator)
        x[where] = specials[which]
    return x


@dataclass(frozen=True)
class Case:
    """One input of the agreement matrix; ``label`` says what it exercises."""

    label: str
    x: torch.Tensor


# Odd sizes hit the tails of vectorised loops; 0 and 1 hit the empty and scalar paths.
ODD_SIZES: tuple[int, ...] = (0, 1, 3, 7, 8, 15, 17, 33, 127, 1000, 4097, 65537)


def agreement_cases(dtype: torch.dtype, device: str | torch.device = "cpu") -> Iterator[Case]:
    """The full input matrix for one dtype: specials alone, odd sizes, and views of several layouts."""
    yield Case("specials", special_values(dtype).to(device))
    for n in ODD_SIZES:
        yield Case(f"numel={n}", random_input(n, dtype, device))
    base = random_input(64 * 129, dtype, device).view(64, 129)
    yield Case("offset by one element", random_input(4099, dtype, device)[1:])
    yield Case("offset by three elements", random_input(4101, dtype, device)[3:])
    yield Case("sliced every other element", random_input(8194, dtype, device)[::2])
    yield Case("transposed (64, 129)", base.t())
    yield Case("column slice of (64, 129)", base[:, 5:100])
    yield Case("permuted 3-d", random_input(4 * 5 * 6, dtype, device).view(4, 5, 6).permute(2, 0, 1))
    yield Case("expanded (stride 0)", random_input(33, dtype, device).view(1, 33).expand(7, 33))
    yield Case("0-d scalar", random_input(1, dtype, device).view(()))
