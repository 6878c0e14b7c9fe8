"""The fused op of csrc/: bitwise agreement, the torch.library contract, boundary checks, the build cache.

CPU tests run everywhere (the first one JIT-builds the extension: about half a minute on two cores,
then it is cached).  Tests marked ``cuda`` need a GPU and cover the CUDA kernel, and the Triton
kernel beside it: tensors past 2^31 elements, misaligned views, CUDA graph capture.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import relu2
from relu2_impls import fused
from relu2.measure.agreement import compare_bitwise
from relu2.measure.inputs import agreement_cases, random_input, special_values
from relu2.measure.reference import relu_squared_reference

# The module, not the function of the same name that relu2 exports.
from relu2.measure import registry  # noqa: E402

from conftest import requires_cuda  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()
# Every test here needs the extension built (or the GPU); see the marker's definition in pyproject.
pytestmark = pytest.mark.slow

ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
FUNCTIONAL = "relu2::relu_squared"
# torch.Tag.out (torch >= 2.13) is what lets torch.compile functionalize the out= overload.
HAS_OUT_TAG = hasattr(torch.Tag, "out")


@pytest.fixture(scope="module", autouse=True)
def built() -> fused.BuildInfo:
    """Build (or load from the cache) once for the whole module."""
    return fused.build()


def assert_bitwise(got: torch.Tensor, expected: torch.Tensor) -> None:
    mismatch = compare_bitwise(got, expected)
    assert mismatch is None, mismatch.describe()


# --- agreement on the CPU ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cpu_agrees_bitwise_on_the_whole_matrix(dtype):
    for case in agreement_cases(dtype, "cpu"):
        relu2.check_agreement("fused", case.x)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cpu_agrees_on_a_large_tensor_split_across_threads(dtype):
    relu2.check_agreement("fused", random_input(1_000_003, dtype))


def test_registry_lists_fused_as_available_on_cpu():
    impl = relu2.get("fused")
    assert impl.available and impl.supports("cpu"), impl.reason
    assert impl.supports("cuda") == fused.has_cuda()


# --- the op's shape and the out= form ------------------------------------------------------------


def test_functional_output_is_contiguous_with_the_input_shape():
    x = random_input(6 * 7, torch.float32).view(6, 7).t()
    y = fused.relu_squared(x)
    assert y.shape == x.shape and y.is_contiguous() and y.dtype == x.dtype
    assert_bitwise(y, relu_squared_reference(x))


def test_out_form_writes_into_out_and_returns_it():
    x = random_input(4 * 5, torch.bfloat16).view(4, 5)
    out = torch.full_like(x, -1.0)
    result = fused.relu_squared(x, out=out)
    assert result is out
    assert_bitwise(out, relu_squared_reference(x))


def test_out_form_with_a_strided_out():
    x = random_input(64 * 3, torch.float16).view(64, 3)
    out = torch.full((3, 64), -1.0, dtype=torch.float16).t()  # right shape, transposed strides
    assert not out.is_contiguous()
    assert fused.relu_squared(x, out=out) is out
    assert_bitwise(out, relu_squared_reference(x))


def test_out_form_in_place_and_with_partial_overlap():
    x = random_input(1001, torch.float32)
    expected = relu_squared_reference(x)
    y = x.clone()
    fused.relu_squared(y, out=y)
    assert_bitwise(y, expected)

    buf = random_input(1002, torch.float32)
    src, dst = buf[:-1], buf[1:]  # dst is src shifted by one element: the kernel must not see this
    expected = relu_squared_reference(src.clone())
    fused.relu_squared(src, out=dst)
    assert_bitwise(dst, expected)


def test_empty_and_zero_dim():
    assert fused.relu_squared(torch.empty(0, 3)).shape == (0, 3)
    x = torch.tensor(-2.5)
    assert fused.relu_squared(x).shape == () and fused.relu_squared(x).item() == 0.0


# --- boundary checks: wrong inputs raise and say what is wrong ----------------------------------


@pytest.mark.parametrize(
    ("x", "name"),
    [
        (torch.arange(4, dtype=torch.int32), "Int"),
        (torch.zeros(4, dtype=torch.bool), "Bool"),
        (torch.zeros(4, dtype=torch.int64), "Long"),
        (torch.zeros(4, dtype=torch.complex64), "ComplexFloat"),
    ],
    ids=["int32", "bool", "int64", "complex64"],
)
def test_non_floating_input_is_refused_by_name(x, name):
    expected = rf"expected a floating-point tensor \(float32, float16, bfloat16, float64\), got {name}"
    with pytest.raises(RuntimeError, match=expected):
        fused.relu_squared(x)
    with pytest.raises(RuntimeError, match=expected):
        fused.relu_squared(x, out=torch.empty(4))


def test_out_of_the_wrong_dtype_is_refused():
    with pytest.raises(RuntimeError, match="out has dtype Half but x has dtype Float"):
        fused.relu_squared(torch.randn(4, 5), out=torch.empty(4, 5, dtype=torch.float16))


def test_out_of_the_wrong_shape_is_refused_not_resized():
    out = torch.empty(20)
    with pytest.raises(RuntimeError, match=r"out has shape \[20\] but x has shape \[4, 5\]"):
        fused.relu_squared(torch.randn(4, 5), out=out)
    assert out.shape == (20,)


def test_out_on_the_meta_device_is_refused():
    # A CPU-testable "other device"; the CUDA/CPU pair is tested under the cuda marker.
    with pytest.raises(RuntimeError, match="out is on meta but x is on cpu"):
        fused.relu_squared(torch.randn(3), out=torch.empty(3, device="meta"))


# --- torch.library contract: opcheck and torch.compile -------------------------------------------


def _opcheck_inputs(device: str) -> dict[str, torch.Tensor]:
    return {
        "contiguous": torch.randn(3, 5, device=device),
        "non-contiguous": torch.randn(5, 3, device=device).t(),
        "empty": torch.randn(0, 4, device=device),
        "bfloat16": torch.randn(17, device=device).to(torch.bfloat16),
    }


def _opcheck_both_overloads(device: str) -> None:
    ops = torch.ops.relu2.relu_squared
    for label, x in _opcheck_inputs(device).items():
        torch.library.opcheck(ops.default, (x,))
        out_utils = None if HAS_OUT_TAG else ("test_schema", "test_autograd_registration", "test_faketensor")
        kwargs = {"out": torch.empty(x.shape, dtype=x.dtype, device=device)}
        if out_utils is None:
            torch.library.opcheck(ops.out, (x,), kwargs)
        else:  # older torch cannot functionalize an untagged out= op; the rest still applies
            torch.library.opcheck(ops.out, (x,), kwargs, test_utils=out_utils)
    # Autograd: the registered formula is exercised through AOT dispatch with a grad-requiring input.
    x = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    torch.library.opcheck(ops.default, (x,))


def test_opcheck_cpu():
    _opcheck_both_overloads("cpu")


def test_gradient_is_two_relu_x():
    x = torch.tensor([-1.5, -0.0, 0.0, 0.5, 3.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fused.relu_squared(x).sum(), x)
    assert torch.equal(grad, 2 * torch.relu(x.detach()))


def test_works_inside_torch_compile_fullgraph():
    @torch.compile(fullgraph=True)
    def f(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if HAS_OUT_TAG:  # older torch cannot functionalize an untagged out= custom op
            fused.relu_squared(x, out=out)
        return fused.relu_squared(x) + 1

    x = random_input(257, torch.float32)
    out = torch.full_like(x, -1.0)
    y = f(x, out)
    assert_bitwise(y, relu_squared_reference(x) + 1)
    if HAS_OUT_TAG:
        assert_bitwise(out, relu_squared_reference(x))


# --- building: cache, second process, failures --------------------------------------------------


def test_build_lands_in_a_keyed_folder_of_the_cache_root(built):
    assert built.directory.parent == fused.cache_root()
    assert built.directory.is_dir() and (built.directory / "relu2-build.json").is_file()
    assert built.cuda == fused.has_cuda()
    assert built.cuda or built.why_no_cuda


def test_cache_key_follows_the_source_contents(tmp_path, monkeypatch):
    same, changed = tmp_path / "same", tmp_path / "changed"
    shutil.copytree(fused.source_dir(), same)
    shutil.copytree(fused.source_dir(), changed)
    (changed / "relu2_cpu.h").write_text((changed / "relu2_cpu.h").read_text() + "// edited\n")
    original = fused._plan().key
    monkeypatch.setenv(fused.ENV_CSRC_DIR, str(same))
    assert fused._plan().key == original  # the folder does not matter, the contents do
    monkeypatch.setenv(fused.ENV_CSRC_DIR, str(changed))
    assert fused._plan().key != original


def _planted_csrc(tmp_path: Path, patch: str) -> Path:
    """A copy of csrc/ with docs/aa/PATCH applied (the plants relu2 compare is judged on)."""
    folder = tmp_path / patch
    shutil.copytree(fused.source_dir(), folder)
    subprocess.run(["git", "apply", "-p2", str(ROOT / "docs" / "aa" / patch)], cwd=folder, check=True)
    return folder


@pytest.mark.parametrize("patch, same_code", [
    ("comment-only.patch", True),
    ("slow-fused-5-blocks.patch", False), ("slow-fused-8-blocks.patch", False),
    ("slow-fused-in-l2.patch", False), ("scatter-fused-20.patch", False),
])
def test_code_key_ignores_comments_and_only_comments(tmp_path, monkeypatch, patch, same_code):
    """The fingerprint of the built kernel (code_key) is blind to a comment, so a compare counts no work for
    it; every planted kernel change still reads as other code.  The build itself is keyed on every byte."""
    original = fused._plan()
    monkeypatch.setenv(fused.ENV_CSRC_DIR, str(_planted_csrc(tmp_path, patch)))
    planted = fused._plan()
    assert planted.key != original.key
    assert (planted.code == original.code) is same_code


def test_code_key_keeps_literals_and_lines(tmp_path, monkeypatch):
    """Layout is squeezed, but "//" in a string is no comment, a newline still ends a preprocessor line,
    and a backslash at a line comment's end makes the next line comment too."""
    source = fused.source_dir()

    def code(name: str, edit) -> str:
        folder = tmp_path / name
        shutil.copytree(source, folder)
        (folder / "relu2_ops.cpp").write_text(edit((folder / "relu2_ops.cpp").read_text()))
        monkeypatch.setenv(fused.ENV_CSRC_DIR, str(folder))
        return fused._plan().code

    original = fused._plan().code
    assert code("layout", lambda t: t.replace("\n", "\n\n  ").replace(" = ", "  =  ") + "/* a block */\n") == original
    assert code("literal-a", lambda t: t.replace('"', '"// a', 1)) != code("literal-b", lambda t: t.replace('"', '"// b', 1))
    assert code("joined", lambda t: t.replace("<ATen/ATen.h>\n#include", "<ATen/ATen.h> #include", 1)) != original
    # A line comment ending in a backslash swallows the next line, as the compiler splices it.
    assert code("spliced", lambda t: t + "// note \\\nint relu2_unused = 1;\n") == original
    assert code("unspliced", lambda t: t + "// note\nint relu2_unused = 1;\n") != original


def test_a_second_process_loads_from_the_cache_without_building():
    code = "from relu2_impls import fused; info = fused.build(); print(info.cached, info.seconds, info.directory)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    cached, seconds, directory = result.stdout.split()
    assert cached == "True" and float(seconds) < 10
    assert Path(directory) == fused.build().directory


def test_build_failure_makes_fused_unavailable_with_the_compiler_error(tmp_path, monkeypatch):
    broken = tmp_path / "csrc"
    shutil.copytree(fused.source_dir(), broken)
    # A missing header is fatal at once in every translation unit, so this build fails in a second.
    for cpp in broken.glob("*.cpp"):
        cpp.write_text('#include "relu2_deliberately_missing.h"\n' + cpp.read_text())
    monkeypatch.setenv(fused.ENV_CSRC_DIR, str(broken))
    monkeypatch.setenv(fused.ENV_CACHE_DIR, str(tmp_path / "cache"))
    # Forget this process's loaded build and resolved registry entry; monkeypatch restores both.
    for attr in ("_module", "_info", "_ops"):
        monkeypatch.setattr(fused, attr, None)
    monkeypatch.setattr(fused, "_failures", {})
    from relu2_impls.entry_points import fused as fused_factory  # what the entry point names

    monkeypatch.setitem(registry._registry, "fused", fused_factory)
    monkeypatch.setattr(registry, "_resolved", registry._resolved - {"fused"})

    impl = registry.get("fused")
    assert not impl.available
    assert "relu2_deliberately_missing.h" in impl.reason
    with pytest.raises(RuntimeError, match="unavailable"):
        impl.fn(torch.randn(3))
    with pytest.raises(fused.BuildError) as excinfo:  # the same failure again, not retried
        fused.load()
    assert "relu2_deliberately_missing.h" in excinfo.value.output_tail
    assert "not retried" in str(excinfo.value)


def _broken_sources(tmp_path: Path) -> dict[str, str]:
    """An environment whose fused extension cannot build (a missing header), with a cache of its own."""
    broken = tmp_path / "csrc"
    shutil.copytree(fused.source_dir(), broken)
    for cpp in broken.glob("*.cpp"):
        cpp.write_text('#include "relu2_deliberately_missing.h"\n' + cpp.read_text())
    return dict(os.environ, **{fused.ENV_CSRC_DIR: str(broken), fused.ENV_CACHE_DIR: str(tmp_path / "cache")})


def test_a_broken_kernel_fails_check_and_sweep_never_skips(tmp_path):
    """The project's own kernel failing to build is a failure with the compiler's message, not "n/a"."""
    env = _broken_sources(tmp_path)
    check = subprocess.run([sys.executable, "-m", "relu2", "check", "--impl", "eager,fused", "--device", "cpu",
                            "--dtype", "float32"], capture_output=True, text=True, env=env, timeout=300)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "FAIL fused: cannot run" in check.stdout and "relu2_deliberately_missing.h" in check.stdout
    out = tmp_path / "sweep"
    run = subprocess.run([sys.executable, "-m", "relu2", "sweep", "--impl", "fused", "--device", "cpu", "--dtype",
                          "float32", "--sizes", "2^10", "--modes", "hot", "--samples", "2", "--no-progress",
                          "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    rows = {r["impl"]: r for r in csv.DictReader(open(out / "sweep.csv"))}
    assert rows["fused"]["status"] == "failed" and "did not build" in rows["fused"]["reason"]
    assert rows["copy"]["status"] == "ok"


@pytest.mark.parametrize("case", ["unwritable cache", "no sources"])
def test_check_names_why_the_kernel_did_not_build(tmp_path, case):
    """A build that cannot start (its cache folder cannot be made, its sources are missing) reads as
    that, with the folder, in ``relu2 check``: never as a wrong kernel, never as a load failure."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    if case == "unwritable cache":  # a folder under a file: unwritable even for root
        env, expected = {fused.ENV_CACHE_DIR: str(blocker / "cache")}, f"cannot create the build folder {blocker}"
    else:
        (tmp_path / "empty").mkdir()
        env = {fused.ENV_CSRC_DIR: str(tmp_path / "empty"), fused.ENV_CACHE_DIR: str(tmp_path / "cache")}
        expected = f"no C++ sources (*.cpp) in {tmp_path / 'empty'}"
    check = subprocess.run([sys.executable, "-m", "relu2", "check", "--impl", "fused", "--device", "cpu",
                            "--dtype", "float32"], capture_output=True, text=True, env={**os.environ, **env},
                           timeout=300)
    assert check.returncode == 1, check.stdout + check.stderr
    assert f"FAIL fused: cannot run: the fused extension did not build: {expected}" in check.stdout, check.stdout
    assert "did not load" not in check.stdout


# --- CUDA: the fused kernel and the Triton kernel ------------------------------------------------

GPU_IMPLS = ("fused", "triton")
GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _gpu_impl(name: str) -> relu2.Implementation:
    impl = relu2.get(name)
    if name == "triton" and not impl.available:
        pytest.skip(f"triton: {impl.reason}")
    assert impl.supports("cuda"), f"{name} cannot run on CUDA: {impl.why_not('cuda')}"
    return impl


def _run(impl: relu2.Implementation, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The implementation's result, written into ``out`` when given (the fused op's out= form)."""
    if out is None:
        return impl.fn(x)
    if impl.name == "fused":
        return fused.relu_squared(x, out=out)
    return out.copy_(impl.fn(x))


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("name", GPU_IMPLS)
def test_gpu_agrees_bitwise_on_the_whole_matrix(name, dtype):
    impl = _gpu_impl(name)
    for case in agreement_cases(dtype, "cuda"):
        relu2.check_agreement(impl, case.x)
    relu2.check_agreement(impl, random_input(1 << 22, dtype, "cuda"))


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("name", GPU_IMPLS)
def test_gpu_float64(name):
    impl = _gpu_impl(name)
    for case in agreement_cases(torch.float64, "cuda"):
        relu2.check_agreement(impl, case.x)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("name", GPU_IMPLS)
def test_gpu_tensor_past_2_31_elements(name):
    """2^31 + 17 bf16 elements (4 GiB in, 4 GiB out): 32-bit indexing would wrap or stop early."""
    numel = 2**31 + 17
    free, _ = torch.cuda.mem_get_info()
    if free < 14 * 2**30:
        pytest.skip(f"needs about 14 GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    impl = _gpu_impl(name)
    x = torch.empty(numel, dtype=torch.bfloat16, device="cuda").normal_()
    specials = special_values(torch.bfloat16).to("cuda")
    # Specials where 32-bit arithmetic goes wrong: around 2^31 and in the last elements.
    x[2**31 - specials.numel() // 2: 2**31 - specials.numel() // 2 + specials.numel()] = specials
    x[-specials.numel():] = specials
    out = torch.full_like(x, -1.0)  # relu² never yields -1: an element left unwritten shows up
    result = _run(impl, x, out)
    assert result.data_ptr() == out.data_ptr()
    chunk = 2**27
    try:
        for start in range(0, numel, chunk):
            piece = slice(start, min(start + chunk, numel))
            mismatch = compare_bitwise(out[piece], relu_squared_reference(x[piece]))
            assert mismatch is None, f"elements from {start}: {mismatch.describe()}"
    finally:
        del x, out, result
        torch.cuda.empty_cache()


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("numel", [1000, 3_000_001], ids=["small", "3M"])
@pytest.mark.parametrize("name", GPU_IMPLS)
def test_gpu_misaligned_input_and_output(name, numel):
    """Views offset by one element are not 16-byte aligned: the kernel's scalar path, at scale too."""
    impl = _gpu_impl(name)
    for dtype in GPU_DTYPES:
        x = random_input(numel + 1, dtype, "cuda")[1:]
        assert x.is_contiguous() and x.data_ptr() % 16 != 0
        relu2.check_agreement(impl, x)
        out = torch.full((numel + 1,), -1.0, dtype=dtype, device="cuda")[1:]
        aligned = random_input(numel, dtype, "cuda")
        _run(impl, aligned, out)
        assert_bitwise(out, relu_squared_reference(aligned))


@pytest.mark.cuda
@requires_cuda
def test_gpu_out_on_another_device_is_refused():
    x = torch.randn(8, device="cuda")
    with pytest.raises(RuntimeError, match=r"out is on cpu but x is on cuda:\d; they must be on the same device"):
        fused.relu_squared(x, out=torch.empty(8))
    with pytest.raises(RuntimeError, match=r"out is on cuda:\d but x is on cpu"):
        fused.relu_squared(torch.randn(8), out=torch.empty(8, device="cuda"))


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("name", GPU_IMPLS)
def test_gpu_inside_cuda_graph_capture(name):
    impl = _gpu_impl(name)
    x = random_input(1 << 16, torch.bfloat16, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (Triton compiles) off the capture
        impl.fn(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = impl.fn(x)
    x.copy_(random_input(1 << 16, torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(y, relu_squared_reference(x))


@pytest.mark.cuda
@requires_cuda
def test_opcheck_cuda():
    assert fused.has_cuda(), fused.build().why_no_cuda
    _opcheck_both_overloads("cuda")


def _cuda_kernels_per_call(fn, x: torch.Tensor) -> int:
    """How many CUDA kernels one call of ``fn`` launches, counted by the profiler (after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


@pytest.mark.cuda
@requires_cuda
def test_gpu_fused_is_one_launch_and_eager_two():
    """The point of fusing: one kernel where eager launches relu then square."""
    x = random_input(1 << 20, torch.bfloat16, "cuda")
    assert _cuda_kernels_per_call(relu2.get("fused").fn, x) == 1
    assert _cuda_kernels_per_call(relu2.relu_squared_reference, x) == 2
