"""Declared exceptions to the bitwise contract (relu2.measure.agreement): NaN -> +0 and writing the input.

An implementation may declare that NaN gives +0 (vLLM's CUDA kernel does: ``f > 0.0f ? f : 0.0f``,
vLLM csrc/activation_kernels.cu, PR #39058) and is then held bitwise everywhere else; one that writes
its input (vLLM's routed experts: ``F.relu(x, inplace=True)``) declares it and is given a clone.
Neither may happen silently.  CPU only; the CUDA kernel's own tests are in tests/test_vllm_cuda.py.
"""

from __future__ import annotations

import pytest
import torch

import relu2
from relu2.measure.agreement import agreement_matrix, compare_bitwise
from relu2.measure.inputs import DTYPES, agreement_cases
from relu2.show.table import format_matrix
from relu2.vocab.schema import Cell


def nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    """vLLM's value rule in torch: fp32 `f > 0 ? f : 0`, squared, rounded once."""
    f = x.float()
    return torch.square(torch.where(f > 0, f, torch.zeros_like(f))).to(x.dtype)


def in_place(x: torch.Tensor) -> torch.Tensor:
    """The routed-expert path: relu in place, square into a new output."""
    out = torch.empty_like(x)
    torch.nn.functional.relu(x, inplace=True)
    return torch.square(x, out=out)


NAN_INPUT = torch.tensor([1.0, float("nan"), -2.0, 3.0, -float("nan"), -0.0])


def test_undeclared_nan_to_zero_still_fails(temporary_impl):
    temporary_impl("undeclared_n0", nan_to_zero)
    with pytest.raises(relu2.AgreementError, match=r"undeclared_n0 on torch.float32 .* got 0.0, expected nan"):
        relu2.check_agreement("undeclared_n0", NAN_INPUT)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_declared_nan_to_zero_passes_the_whole_matrix(temporary_impl, dtype):
    temporary_impl("declared_n0", nan_to_zero, nan_to_zero=True)
    cases = list(agreement_cases(dtype))
    assert any(torch.isnan(c.x).any() for c in cases)  # the declaration is exercised, not vacuous
    for case in cases:
        relu2.check_agreement("declared_n0", case.x)


def test_declared_nan_to_zero_is_held_bitwise_everywhere_else(temporary_impl):
    def one_ulp_off(x):
        out = nan_to_zero(x)
        out[3] = torch.nextafter(out[3], torch.tensor(float("inf")))  # 9.0 -> 9.0 + 1 ULP, a non-NaN input
        return out

    temporary_impl("n0_plus_ulp", one_ulp_off, nan_to_zero=True)
    with pytest.raises(relu2.AgreementError, match=r"\(declared: NaN -> \+0\).*1 of 6 elements differ, max 1 ULP; "
                                                   r"first at index \(3,\)"):
        relu2.check_agreement("n0_plus_ulp", NAN_INPUT)


@pytest.mark.parametrize("at_nan", [float("nan"), -0.0, 1.0], ids=["nan kept", "-0", "1.0"])
def test_declared_nan_to_zero_means_exactly_plus_zero(temporary_impl, at_nan):
    """The declaration is +0 where the input is NaN: keeping NaN, -0 or anything else there fails."""

    def wrong_at_nan(x):
        return torch.where(torch.isnan(x), torch.full_like(x, at_nan), nan_to_zero(x))

    temporary_impl("n0_wrong_at_nan", wrong_at_nan, nan_to_zero=True)
    with pytest.raises(relu2.AgreementError, match=r"first at index \(1,\)"):
        relu2.check_agreement("n0_wrong_at_nan", NAN_INPUT)


def test_declared_writes_input_passes_and_leaves_the_callers_tensor_alone(temporary_impl):
    temporary_impl("declared_in_place", in_place, writes_input=True)
    for dtype in DTYPES:
        for case in agreement_cases(dtype):
            before = case.x.clone()
            relu2.check_agreement("declared_in_place", case.x)
            assert compare_bitwise(case.x, before) is None, case.label  # bit for bit, NaNs included


def test_undeclared_in_place_fails(temporary_impl):
    temporary_impl("undeclared_in_place", in_place)
    with pytest.raises(relu2.AgreementError, match="modified its input"):
        relu2.check_agreement("undeclared_in_place", torch.randn(1000))


def test_eager_inplace_is_registered_with_its_declaration_and_agrees():
    """The entry point (pyproject.toml) resolves to vLLM's routed-expert calls and passes the matrix."""
    impl = relu2.implementations()["eager_inplace"]
    assert impl.available and impl.writes_input and not impl.nan_to_zero
    assert set(impl.devices) == {"cpu", "cuda"} and impl.declared == ("writes its input",)
    x = torch.randn(64, 1856)
    x[0, :4] = torch.tensor([float("nan"), -0.0, -1.0, 3.0])
    before = x.clone()
    relu2.check_agreement("eager_inplace", x)
    assert torch.equal(x.view(torch.int32), before.view(torch.int32))  # the caller's tensor, untouched
    for dtype in DTYPES:
        for case in agreement_cases(dtype):
            relu2.check_agreement("eager_inplace", case.x)
    # Called directly it does what vLLM's experts do: the input now holds relu(x).
    y = impl.fn(x)
    assert compare_bitwise(x, torch.relu(before)) is None
    assert compare_bitwise(y, torch.square(torch.relu(before))) is None


def test_relu2_check_shows_the_declarations(temporary_impl, capsys):
    from relu2 import cli

    temporary_impl("declared_n0", nan_to_zero, nan_to_zero=True)
    matrix = agreement_matrix(["eager", "declared_n0", "eager_inplace"], ["float32"], "cpu")
    assert not matrix.failed
    assert matrix.declared == {"declared_n0": ("NaN -> +0",), "eager_inplace": ("writes its input",)}
    text = format_matrix(matrix)
    assert any(line.startswith("declared_n0") and line.endswith("ok          (declared: NaN -> +0)")
               for line in text.splitlines()), text
    assert any(line.startswith("eager ") and "declared" not in line for line in text.splitlines())
    assert cli.main(["check", "--impl", "declared_n0,eager_inplace", "--dtype", "bfloat16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "(declared: NaN -> +0)" in out and "(declared: writes its input)" in out


def test_relu2_check_fails_an_undeclared_nan_to_zero(temporary_impl, capsys):
    from relu2 import cli

    temporary_impl("undeclared_n0", nan_to_zero)
    assert cli.main(["check", "--impl", "undeclared_n0", "--dtype", "float32", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "(declared" not in out


def test_measure_gives_a_writes_input_implementation_a_fresh_input_per_series(temporary_impl):
    """Agreement, each mode's call series and the timed input are never one spoiled tensor."""
    from relu2.measure.cell import measure_cell
    from relu2.measure.timing import Budget

    seen: list[bool] = []  # per call: did the input still hold negatives (unspoiled)?

    def recording(x):
        seen.append(bool((x < 0).any()))
        return in_place(x)

    temporary_impl("recorded_in_place", recording, writes_input=True)
    modes = ("hot", "launch")
    result = measure_cell(Cell("recorded_in_place", "float32", 4096, (4096,)), modes, "cpu",
                          Budget(samples=2, sample_ms=0.1, max_calls=4))
    assert result.status == "ok" and all(o.status == "ok" for o in result.outcomes.values()), result
    # The agreement call (on a clone) and the first call of each mode's series each start unspoiled;
    # with one input shared by the modes only the first series would.
    assert sum(seen) >= 1 + len(modes), seen
    assert seen[0] and seen.count(True) < len(seen)  # and calls within a series do see relu(x)
