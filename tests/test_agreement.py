"""The bitwise contract itself: the comparison catches what it must and names it."""

import math

import pytest
import torch

import relu2
from relu2.measure.agreement import compare_bitwise
from relu2.measure.inputs import DTYPES, agreement_cases, random_input, special_values


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values_cover_the_contract(dtype):
    v = special_values(dtype)
    assert torch.isnan(v).any() and torch.isinf(v).any()
    assert (v == 0).any() and torch.signbit(v[v == 0]).any()
    finfo = torch.finfo(dtype)
    subnormal = (v != 0) & (v.abs() < finfo.smallest_normal) & v.isfinite()
    assert subnormal.any()
    # Some finite value must overflow when squared in the input dtype.
    assert (v.isfinite() & torch.isinf(torch.square(v))).any()


def test_random_input_is_fresh_and_has_specials():
    a, b = random_input(10_000, torch.float32), random_input(10_000, torch.float32)
    assert not torch.equal(a, b)
    assert torch.isnan(a).any() and (a != 0).sum() > 9000


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_eager_agrees_on_the_whole_matrix(dtype):
    cases = list(agreement_cases(dtype))
    labels = {c.label for c in cases}
    assert {"offset by one element", "transposed (64, 129)", "numel=0", "specials"} <= labels
    assert any(not c.x.is_contiguous() for c in cases)
    for case in cases:
        relu2.check_agreement("eager", case.x)


def test_compare_bitwise_equal_nans_match():
    x = torch.tensor([float("nan"), 1.0, -float("nan")])
    assert compare_bitwise(x, x.clone()) is None


def test_compare_bitwise_reports_ulps_and_first_index():
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    got = expected.clone()
    got[1, 0] = torch.nextafter(torch.tensor(3.0), torch.tensor(10.0))
    got[1, 1] = torch.nextafter(got[1, 1], torch.tensor(10.0))
    got[1, 1] = torch.nextafter(got[1, 1], torch.tensor(10.0))
    m = compare_bitwise(got, expected)
    assert m is not None and m.count == 2 and m.max_ulp == 2
    assert m.first_index == (1, 0) and m.expected == 3.0


def test_compare_bitwise_catches_nan_where_a_number_was_expected():
    m = compare_bitwise(torch.tensor([0.0, float("nan")]), torch.tensor([0.0, 0.0]))
    assert m is not None and m.count == 1 and math.isinf(m.max_ulp) and m.first_index == (1,)


def test_compare_bitwise_catches_negative_zero():
    m = compare_bitwise(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert m is not None and m.count == 1


def test_vllm_style_nan_to_zero_is_rejected():
    """vLLM's kernel maps NaN to 0; the contract says NaN in, NaN out."""
    name = "nan_to_zero"
    relu2.register(name, lambda x: torch.square(torch.where(x > 0, x, torch.zeros_like(x))))
    try:
        with pytest.raises(relu2.AgreementError, match=r"nan_to_zero on torch.float32 .* got 0.0, expected nan"):
            relu2.check_agreement(name, torch.tensor([1.0, float("nan"), 2.0]))
    finally:
        relu2.unregister(name)


def test_fp16_square_in_half_precision_is_caught():
    """Squaring without the fp32 upcast rounds twice on some inputs; the check must notice."""
    x = random_input(1 << 16, torch.bfloat16, special_fraction=0)
    wrong = (torch.relu(x).float().to(torch.float16) ** 2).to(torch.bfloat16)
    assert compare_bitwise(wrong, relu2.relu_squared_reference(x)) is not None


def test_shape_dtype_device_mismatch_named():
    relu2.register("wrong_dtype", lambda x: relu2.relu_squared_reference(x).double())
    relu2.register("wrong_shape", lambda x: relu2.relu_squared_reference(x).reshape(-1)[:-1])
    try:
        with pytest.raises(relu2.AgreementError, match="dtype torch.float64 differs"):
            relu2.check_agreement("wrong_dtype", torch.randn(8))
        with pytest.raises(relu2.AgreementError, match="shape"):
            relu2.check_agreement("wrong_shape", torch.randn(8))
    finally:
        relu2.unregister("wrong_dtype")
        relu2.unregister("wrong_shape")


def test_input_mutation_is_caught():
    relu2.register("in_place", lambda x: torch.square_(torch.relu_(x)))
    try:
        with pytest.raises(relu2.AgreementError, match="modified its input"):
            relu2.check_agreement("in_place", torch.randn(64))
    finally:
        relu2.unregister("in_place")
