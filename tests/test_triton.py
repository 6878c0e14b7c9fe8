"""The Triton relu² (relu2_impls.triton_kernel): importable where triton is installed, its arithmetic checked
on the CPU through Triton's interpreter, and its boundary on a GPU.

The full CUDA agreement matrix, the 2^31-element tensor, misaligned views and CUDA graph capture are
in tests/test_fused.py, parametrised over the fused and Triton kernels alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from conftest import requires_cuda  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()

# Runs in a fresh process: TRITON_INTERPRET must be set before the kernel is decorated (imported).
# bfloat16 is left out because the interpreter rounds fp32 -> bf16 by truncation, unlike the GPU
# (cvt.rn.bf16.f32, round to nearest even); it is covered by the GPU tests.
_INTERPRETER_CHECK = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from relu2.measure.agreement import compare_bitwise
from relu2.measure.inputs import agreement_cases, random_input
from relu2.measure.reference import relu_squared_reference
from relu2_impls.triton_kernel import _launch

failures = []
for dtype in (torch.float32, torch.float16, torch.float64):
    inputs = [(case.label, case.x) for case in agreement_cases(dtype)] + [("20k", random_input(20_003, dtype))]
    for label, x in inputs:
        src = x.contiguous()
        out = torch.empty_like(src)
        _launch(src, out)
        mismatch = compare_bitwise(out, relu_squared_reference(src))
        if mismatch is not None:
            failures.append(f"{dtype} {label}: {mismatch.describe()}")
print("\\n".join(failures) or "ok")
"""


def test_importable_and_refuses_what_it_cannot_run():
    from relu2_impls.triton_kernel import relu_squared_triton

    with pytest.raises(RuntimeError, match=r"expected a floating-point tensor .*got torch.int32"):
        relu_squared_triton(torch.zeros(3, dtype=torch.int32))
    if not HAS_CUDA:
        with pytest.raises(RuntimeError, match="expected a CUDA tensor"):
            relu_squared_triton(torch.zeros(3))


def test_interpreter_agrees_bitwise_on_cpu():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", _INTERPRETER_CHECK], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip() == "ok", result.stdout


@pytest.mark.cuda
@requires_cuda
def test_gpu_empty_zero_dim_and_strided():
    from relu2.measure.agreement import compare_bitwise
    from relu2.measure.reference import relu_squared_reference
    from relu2_impls.triton_kernel import relu_squared_triton

    assert relu_squared_triton(torch.empty(0, 3, device="cuda")).shape == (0, 3)
    for x in (torch.tensor(-2.0, device="cuda"), torch.randn(65, 33, device="cuda").t()):
        y = relu_squared_triton(x)
        assert y.shape == x.shape and y.is_contiguous()
        assert compare_bitwise(y, relu_squared_reference(x)) is None


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_runs_on_the_tensors_device_not_the_current_one():
    from relu2.measure.agreement import compare_bitwise
    from relu2.measure.reference import relu_squared_reference
    from relu2_impls.triton_kernel import relu_squared_triton

    x = torch.randn(10_000, device="cuda:1")
    with torch.cuda.device(0):
        y = relu_squared_triton(x)
    assert y.device == x.device
    assert compare_bitwise(y, relu_squared_reference(x)) is None
