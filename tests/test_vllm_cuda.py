"""vllm_cuda: the kernel of vLLM's relu_squared structure (csrc/vllm_relu2_kernel.cu).

vLLM's kernel (vllm-project/vllm csrc/activation_kernels.cu, PR #39058: ``relu_squared_kernel`` run by
``activation_kernel``) computes ``f > 0.0f ? f : 0.0f`` in fp32 and squares it: NaN gives +0.  The
kernel here does the same with one block per token row and 128-bit vectors, so it must agree with the
eager path bitwise everywhere except at NaN inputs, where it gives +0 exactly (its declaration).

The CUDA tests (``@pytest.mark.cuda``) are skipped without a GPU; the first two run everywhere.
"""

from __future__ import annotations

import pytest
import torch

import relu2
from relu2.measure.agreement import agreement_matrix, compare_bitwise, expected_output
from relu2.measure.inputs import DTYPES, agreement_cases, random_input
from relu2.measure.registry import get
from relu2.show.table import format_matrix
from relu2.vocab.schema import DTYPES as DTYPE_NAMES

from conftest import HAS_CUDA

INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def vllm_relu_squared(x: torch.Tensor) -> torch.Tensor:
    from relu2_impls import fused

    return fused.vllm_relu_squared(x)


def assert_agrees(x: torch.Tensor, what: str = "") -> None:
    """The op's output is the reference with +0 where x is NaN, bit for bit (what check_agreement holds it to)."""
    got = vllm_relu_squared(x)
    assert got.shape == x.shape and got.dtype == x.dtype and got.device == x.device
    mismatch = compare_bitwise(got, expected_output(get("vllm_cuda"), x))
    assert mismatch is None, f"{what} {x.dtype} {tuple(x.shape)} strides {x.stride()}: {mismatch.describe()}"


# --- everywhere -----------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA reason")
def test_vllm_cuda_unavailable_without_cuda_says_why():
    impl = relu2.implementations()["vllm_cuda"]
    assert not impl.available and not impl.broken and "CUDA" in impl.reason
    assert impl.devices == ("cuda",)


def test_the_op_refuses_a_cpu_tensor_clearly():
    """The extension defines the op in every build; on a CPU tensor it says it is CUDA only."""
    with pytest.raises(RuntimeError, match=r"relu2::vllm_relu_squared: CUDA only"):
        vllm_relu_squared(torch.randn(8))
    with pytest.raises(RuntimeError, match=r"expected float32, float16 or bfloat16"):
        vllm_relu_squared(torch.randn(8, dtype=torch.float64))


# --- on a GPU -------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_vllm_cuda_is_available_with_its_declaration():
    impl = relu2.implementations()["vllm_cuda"]
    assert impl.available, impl.reason
    assert impl.nan_to_zero and not impl.writes_input and impl.devices == ("cuda",)
    assert impl.declared == ("NaN -> +0",)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_agrees_on_the_full_agreement_matrix_with_the_declaration(dtype):
    cases = list(agreement_cases(dtype, "cuda"))
    assert any(torch.isnan(c.x).any() for c in cases)
    for case in cases:
        relu2.check_agreement("vllm_cuda", case.x)


@pytest.mark.cuda
def test_relu2_check_on_cuda_is_ok_and_shows_the_declaration():
    matrix = agreement_matrix(["vllm_cuda"], list(DTYPE_NAMES), "cuda")
    text = format_matrix(matrix)
    assert not matrix.failed, text
    row = next(line for line in text.splitlines() if line.startswith("vllm_cuda"))
    assert row.split()[1:1 + len(DTYPE_NAMES)] == ["ok"] * len(DTYPE_NAMES), row
    assert row.endswith("(declared: NaN -> +0)"), row


@pytest.mark.cuda
def test_without_the_declaration_the_same_kernel_fails(temporary_impl):
    """The declaration, not the kernel, is what lets NaN -> +0 pass."""
    temporary_impl("vllm_cuda_undeclared", vllm_relu_squared, devices=("cuda",))
    with pytest.raises(relu2.AgreementError, match=r"got 0.0, expected nan"):
        relu2.check_agreement("vllm_cuda_undeclared", torch.tensor([1.0, float("nan")], device="cuda"))


NAN_BITS = {  # quiet and signalling NaNs of both signs, with payloads
    torch.float32: [0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0xFFBFFFFF],
    torch.float16: [0x7E00, 0xFE00, 0x7E01, 0x7C01, 0xFDFF],
    torch.bfloat16: [0x7FC0, 0xFFC0, 0x7FC1, 0x7F81, 0xFFBF],
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [5, 8, 16, 1856], ids=lambda w: f"width{w}")  # scalar and vector paths
def test_nan_gives_exactly_plus_zero(dtype, width):
    """Every NaN (any sign, payload, quiet or signalling) gives the bits of +0; so do -0 and negatives."""
    int_dtype = INT_VIEW[dtype]
    bits = NAN_BITS[dtype]
    x = random_input(3 * width, dtype, "cuda", special_fraction=0).view(3, width)
    flat = x.view(-1)
    signed = torch.tensor([b - (1 << (8 * x.element_size())) if b >= 1 << (8 * x.element_size() - 1) else b
                           for b in bits], dtype=int_dtype, device="cuda")
    nan_at = torch.arange(len(bits), device="cuda") * (3 * width // len(bits))
    flat.view(int_dtype)[nan_at] = signed
    flat[-1] = -0.0
    flat[-2] = -1.5
    assert torch.isnan(flat[nan_at]).all()
    y = vllm_relu_squared(x).view(-1)
    zero_positions = torch.cat([nan_at, torch.tensor([flat.numel() - 2, flat.numel() - 1], device="cuda")])
    assert (y.view(int_dtype)[zero_positions] == 0).all(), y[zero_positions]  # +0: every bit clear
    assert_agrees(x, "NaN")


ODD_SIZES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 127, 1000, 4097, 65537)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_odd_sizes_and_offsets(dtype):
    """1-d inputs of odd lengths starting 0-7 elements past a 16-byte boundary (scalar path unless aligned)."""
    for n in ODD_SIZES:
        for offset in range(8):
            assert_agrees(random_input(n + offset, dtype, "cuda")[offset:], f"numel={n} offset={offset}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (83, 1000), (6 * 64, 1855), (5, 1857), (2048, 3713),
                                   (83, 1856), (2048, 3712), (16, 13824), (3, 1024 * 8 * 2 + 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_token_rows(dtype, shape):
    """2-D (tokens, hidden): hidden not a multiple of 8 (scalar path), and multiples (vector path, more
    vectors per row than threads per block included), at a 16-byte aligned base and one element past it."""
    tokens, hidden = shape
    assert_agrees(random_input(tokens * hidden, dtype, "cuda").view(tokens, hidden), "aligned")
    assert_agrees(random_input(tokens * hidden + 1, dtype, "cuda")[1:].view(tokens, hidden), "offset by one")
    # A strided (column-sliced) view is made contiguous at the op's boundary.
    wide = random_input(tokens * (hidden + 3), dtype, "cuda").view(tokens, hidden + 3)
    assert_agrees(wide[:, 2:hidden + 2], "column slice")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("width", [(1 << 22) + 8, (1 << 22) + 3], ids=["vector", "scalar"])
def test_one_very_long_row(dtype, width):
    """One block loops over a row thousands of times its size (1024 threads, 2^22 elements)."""
    assert_agrees(random_input(2 * width, dtype, "cuda").view(2, width), "long rows")


@pytest.mark.cuda
@pytest.mark.slow
def test_rows_past_2_to_the_32_elements():
    """64-bit row offsets: vLLM's `blockIdx.x * d` is a 32-bit product and would wrap here.

    bf16 [2^17 + 1, 2^15]: 2^32 + 2^15 elements (8 GiB in, 8 GiB out).  The rows that straddle 2^31 and
    2^32 elements and the first and last rows are checked against the reference (a wrapped offset
    would write the last row over the first).
    """
    free, _ = torch.cuda.mem_get_info()
    if free < 20 * 2**30:
        pytest.skip(f"needs about 20 GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    rows, width = (1 << 17) + 1, 1 << 15
    x = torch.empty(rows, width, dtype=torch.bfloat16, device="cuda").normal_()
    x[-1, :5] = torch.tensor([float("nan"), -0.0, -1.0, 2.0, float("inf")], dtype=torch.bfloat16)
    y = vllm_relu_squared(x)
    torch.cuda.synchronize()
    impl = get("vllm_cuda")
    for r in (0, 1, (1 << 16) - 1, 1 << 16, (1 << 17) - 1, 1 << 17):  # 2^16 rows = 2^31 elements
        mismatch = compare_bitwise(y[r], expected_output(impl, x[r]))
        assert mismatch is None, f"row {r}: {mismatch.describe()}"
    del x, y
    torch.cuda.empty_cache()


@pytest.mark.cuda
@pytest.mark.slow
def test_more_rows_than_one_grid_dimension_is_refused_at_the_boundary():
    """2^31 rows of one element: more blocks than gridDim.x allows; the binding says so before launching."""
    free, _ = torch.cuda.mem_get_info()
    if free < 6 * 2**30:
        pytest.skip("needs about 6 GiB of free GPU memory")
    x = torch.empty(1 << 31, 1, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match=r"at most 2\^31 - 1 rows"):
        vllm_relu_squared(x)
    del x
    torch.cuda.empty_cache()


@pytest.mark.cuda
def test_op_passes_opcheck_and_traces():
    """Schema, fake kernel and the dispatcher agree (torch.library.opcheck), and torch.compile traces it."""
    x = random_input(83 * 1856, torch.bfloat16, "cuda").view(83, 1856)
    eager = vllm_relu_squared(x)  # loads the extension, so torch.ops.relu2 has the op
    op = torch.ops.relu2.vllm_relu_squared.default
    torch.library.opcheck(op, (x,), test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    compiled = torch.compile(lambda t: op(t), fullgraph=True)
    assert compare_bitwise(compiled(x), eager) is None


@pytest.mark.cuda
def test_measured_in_every_mode():
    """The timers (CUDA graphs for hot and cold, eager calls for launch) run it; the cell is ok."""
    from relu2.measure.cell import measure_cell
    from relu2.vocab.schema import Cell
    from relu2.measure.timing import Budget

    result = measure_cell(Cell("vllm_cuda", "bfloat16", 83 * 1856, (83, 1856)), ("hot", "cold", "launch"), "cuda",
                          Budget(samples=3, sample_ms=1.0, max_calls=50))
    assert result.status == "ok", result.reason
    assert {m: o.status for m, o in result.outcomes.items()} == {"hot": "ok", "cold": "ok", "launch": "ok"}, result
    assert result.kernel  # the build's key
