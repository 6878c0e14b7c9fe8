"""The implementation registry: built-ins, user registration, entry points, unavailability."""

import subprocess
import sys

import pytest
import torch

import relu2

# The module, not the function of the same name that relu2 exports.
from relu2.measure import registry  # noqa: E402
from relu2.measure.inputs import DTYPES, agreement_cases

BUILTIN = {"eager", "compile", "compile_dynamic", "fused", "triton", "copy"}


def test_builtins_listed_with_the_public_fields():
    impls = relu2.implementations()
    assert BUILTIN <= set(impls)
    for name, impl in impls.items():
        assert impl.name == name and callable(impl.fn) and isinstance(impl.available, bool)
        assert impl.available or impl.reason, f"{name} is unavailable without a reason"
    assert not impls["copy"].is_relu2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA reason")
def test_triton_unavailable_without_cuda_says_why():
    triton = relu2.implementations()["triton"]
    assert not triton.available and "CUDA" in triton.reason
    with pytest.raises(RuntimeError, match="unavailable"):
        relu2.relu_squared(torch.randn(4), impl="triton")


def test_import_is_cheap_and_builds_nothing():
    code = "import sys, relu2; print('relu2_impls.fused' in sys.modules, 'torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_relu_squared_by_name():
    x = torch.randn(100)
    assert torch.equal(relu2.relu_squared(x, impl="eager"), relu2.relu_squared_reference(x))
    with pytest.raises(KeyError, match="unknown implementation 'nope'.*eager"):
        relu2.relu_squared(x, impl="nope")


def test_user_registration_is_listed_and_checked():
    impl = relu2.register("mine", lambda x: torch.clamp(x, min=0) * torch.clamp(x, min=0), description="clamp twice")
    try:
        assert relu2.implementations()["mine"] is impl and impl.available
        for dtype in DTYPES:
            for case in agreement_cases(dtype):
                relu2.check_agreement("mine", case.x)
        with pytest.raises(ValueError, match="already registered"):
            relu2.register("mine", torch.clone)
    finally:
        relu2.unregister("mine")
    assert "mine" not in relu2.implementations()


def test_register_rejects_bad_arguments():
    with pytest.raises(ValueError, match="identifier"):
        relu2.register("has space", torch.clone)
    with pytest.raises(TypeError, match="callable"):
        relu2.register("notfn", 3)
    with pytest.raises(ValueError, match="instrument's references"):
        relu2.unregister("eager")


def test_a_factory_that_raises_becomes_unavailable(monkeypatch):
    def broken():
        raise OSError("no such library")

    monkeypatch.setitem(registry._registry, "broken", broken)
    impl = relu2.implementations()["broken"]
    assert not impl.available and "no such library" in impl.reason
    with pytest.raises(RuntimeError, match="unavailable"):
        impl.fn(torch.randn(2))


def test_entry_point_group_is_loaded(monkeypatch):
    class FakeEntryPoint:
        name, value = "from_plugin", "plugin:impl"

        def load(self):
            return relu2.Implementation("from_plugin", relu2.relu_squared_reference)

    class BadEntryPoint:
        name, value = "bad_plugin", "plugin:missing"

        def load(self):
            raise ImportError("No module named 'plugin'")

    monkeypatch.setattr(registry, "entry_points", lambda: [FakeEntryPoint(), BadEntryPoint()])
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    impls = relu2.implementations()
    assert impls["from_plugin"].available
    relu2.check_agreement("from_plugin", torch.randn(33))
    assert not impls["bad_plugin"].available and "No module named 'plugin'" in impls["bad_plugin"].reason


@pytest.mark.slow
@pytest.mark.parametrize("name", ["compile", "compile_dynamic", "compile_dim0", "compile_dynamic_1tok",
                                  "compile_dim0_1tok"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_paths_agree_on_cpu(name, dtype):
    for case in agreement_cases(dtype):
        relu2.check_agreement(name, case.x)


RECOMPILES = {  # three inputs that each need a graph of their own
    "compile": [torch.randn(5), torch.randn(6), torch.randn(7)],
    "compile_dynamic": [torch.randn(5), torch.randn(5).half(), torch.randn(5).bfloat16()],
    "compile_dim0": [torch.randn(2, 5), torch.randn(2, 6), torch.randn(2, 7)],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECOMPILES))
def test_compiled_paths_fail_loudly_instead_of_falling_back(name):
    """Past dynamo's recompile limit, a compiled path must raise, never quietly run eager code."""
    import torch._dynamo

    from relu2.measure.compiled import RECOMPILE_LIMIT, Compiled

    compiled = Compiled(name, recipe(name))  # a fresh function: a cache of its own
    assert torch._dynamo.config.fail_on_recompile_limit_hit
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT
    options = dict(compiled.recipe.options or {})
    if name == "compile":  # the instrument's baseline: heuristic configs, no timing lottery
        assert options["triton.autotune_pointwise"] is False
    else:  # vLLM's paths: inductor's default, as vLLM leaves it
        assert "triton.autotune_pointwise" not in options
    first, second, third = RECOMPILES[name]
    with torch._dynamo.config.patch(recompile_limit=2):  # a small limit, restored afterwards
        compiled(first)
        compiled(second)
        with pytest.raises(relu2.CompileFallbackError, match="recompile limit"):
            compiled(third)


def recipe(name: str):
    """How ``name`` is compiled: the instrument's static baseline, or vLLM's calls from relu2_impls."""
    from relu2.measure.registry import STATIC_COMPILE
    from relu2_impls.vllm import recipes

    return STATIC_COMPILE if name == "compile" else recipes()[name]


FINGERPRINT = """
import sys, torch
from relu2.measure.compiled import Compiled
from relu2.measure.registry import STATIC_COMPILE
from relu2_impls.vllm import recipes
path = Compiled(sys.argv[1], STATIC_COMPILE if sys.argv[1] == "compile" else recipes()[sys.argv[1]])
for shape in ((64, 8), (3, 8), (1, 8)):
    path.prepare(torch.float32, shape, "cpu")
    x = torch.randn(shape)
    path(x)
    print(path.fingerprint(x))
"""


@pytest.mark.slow
def test_a_dynamic_path_is_warmed_at_its_first_shape_and_fingerprinted_the_same_in_every_process():
    def run(name: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", FINGERPRINT, name], capture_output=True, text=True, check=True)
        return out.stdout.split()

    big_first = run("compile_dynamic")
    assert len(big_first) == 3 and all(len(h) == 16 for h in big_first)
    assert big_first[0] == big_first[1]  # (64, 8) and (3, 8): both served by the kernel warmed at (16384, 8)
    assert big_first[2] != big_first[0]  # one token: dynamo specialises size 1, a graph of its own
    assert run("compile_dynamic") == big_first  # another process, empty caches: the same generated code
    static = run("compile")
    assert len(set(static)) == 3  # static: a kernel per shape


def test_compiled_paths_say_how_they_are_compiled():
    impls = relu2.implementations()
    assert "dynamic=True" in impls["compile_dynamic"].description and "16384 tokens" in impls["compile_dynamic"].description
    assert "graph_partition" in impls["compile_dynamic"].description
    assert "mark_dynamic(x, 0)" in impls["compile_dim0"].description
    assert "first called at 1 token" in impls["compile_dim0_1tok"].description


def test_a_python_kernels_fingerprint_ignores_comments_and_blank_lines(tmp_path, monkeypatch):
    """triton's fingerprint is its module's code, not its text: a comment is the same kernel (no work is
    counted for it in a compare), a changed constant is not."""
    import importlib

    from relu2_impls.entry_points import _source_hash

    kernel = "BLOCK = 1024\n\n\ndef relu2(x):\n    return x * x  # squared\n"
    variants = {"original": kernel, "commented": "# relu squared\n" + kernel.replace("\n\n\n", "\n\n# two\n\n"),
                "changed": kernel.replace("1024", "2048")}
    monkeypatch.syspath_prepend(str(tmp_path))
    hashes = {}
    for name, text in variants.items():
        (tmp_path / f"kernel_{name}.py").write_text(text)
        hashes[name] = _source_hash(importlib.import_module(f"kernel_{name}"))
    assert hashes["commented"] == hashes["original"] != hashes["changed"]
