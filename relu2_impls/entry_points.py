"""The entry points of interface 1 (``pyproject.toml``): one factory per implementation."""

from __future__ import annotations

from functools import partial

from relu2.interface import Implementation, Kernel, unavailable


def fused() -> Implementation:
    """csrc/'s op through torch.library: the CUDA kernel where one builds, the C++ twin on the CPU."""
    from relu2_impls import fused as op

    try:
        op.load()
    except Exception as e:  # a failed build carries the compiler's message; the project's kernel is broken
        return unavailable("fused", f"the fused extension did not build: {e}", broken=True)
    return Implementation("fused", op.relu_squared, devices=("cpu", "cuda") if op.has_cuda() else ("cpu",),
                          description="csrc/ kernel via torch.library (CUDA kernel and C++ CPU twin)",
                          fingerprint=_constant(op.code_key()), kernel=_built_kernel)


def triton() -> Implementation:
    """The Liger-style Triton kernel (CUDA only)."""
    import torch

    if not torch.cuda.is_available():
        return unavailable("triton", "needs CUDA: torch.cuda.is_available() is False", devices=("cuda",))
    try:
        from relu2_impls import triton_kernel
    except Exception as e:  # triton missing or too old
        return unavailable("triton", f"triton did not import: {e}", devices=("cuda",))
    return Implementation("triton", triton_kernel.relu_squared_triton, devices=("cuda",),
                          description="hand-written Triton kernel (Liger-style)",
                          fingerprint=_constant(_source_hash(triton_kernel)), kernel=_triton_kernel)


def vllm_cuda() -> Implementation:
    """A kernel of vLLM's relu_squared structure (csrc/vllm_relu2_kernel.cu): CUDA only, NaN -> +0 declared."""
    import torch

    devices = ("cuda",)
    if not torch.cuda.is_available():
        return unavailable("vllm_cuda", "needs CUDA: torch.cuda.is_available() is False", devices=devices)
    from relu2_impls import fused as op

    try:
        info = op.build()
    except Exception as e:  # the project's own kernel did not build: its cells fail, never "n/a"
        return unavailable("vllm_cuda", f"the fused extension did not build: {e}", broken=True, devices=devices)
    if not info.cuda:  # built for the CPU only (no toolkit): absent for a reason outside the project
        return unavailable("vllm_cuda", f"the fused extension was built without CUDA: {info.why_no_cuda}",
                           devices=devices)
    return Implementation("vllm_cuda", op.vllm_relu_squared, devices=devices, nan_to_zero=True,
                          description="csrc/ kernel of vLLM's relu_squared structure (a block per token row, "
                                      "128-bit vectors, fp32 f > 0 ? f : 0 squared): NaN -> +0, declared",
                          fingerprint=_constant(op.code_key()), kernel=_built_kernel)


def eager_inplace() -> Implementation:
    """vLLM's routed-expert path: relu in place, then square into a given output (writes its input)."""
    from relu2_impls import moe

    return Implementation("eager_inplace", moe.relu_squared_inplace, writes_input=True,
                          description="F.relu(x, inplace=True); torch.square(x, out=y): vLLM's routed MoE "
                                      "experts (RELU2_NO_MUL); overwrites its input, declared")


def _vllm_compiled(name: str) -> Implementation:
    """One of vLLM's torch.compile calls on relu² (relu2_impls/vllm.py), resolved on first use."""
    from relu2_impls import vllm

    return vllm.compiled(name)


# One entry point each (pyproject.toml names them), so listing the implementations compiles nothing.
compile_dynamic = partial(_vllm_compiled, "compile_dynamic")
compile_dim0 = partial(_vllm_compiled, "compile_dim0")
compile_model = partial(_vllm_compiled, "compile_model")
compile_dynamic_1tok = partial(_vllm_compiled, "compile_dynamic_1tok")
compile_dim0_1tok = partial(_vllm_compiled, "compile_dim0_1tok")
# Warmed at one token: measured beside their 16384-token twins in the WarmupOrder suite, not in a default sweep.
compile_dynamic_1tok.in_default_sweep = compile_dim0_1tok.in_default_sweep = False


def _built_kernel(x) -> Kernel:
    """The kernel of the built extension (csrc/) that serves ``x``: CUDA on a GPU tensor, the C++ twin on the CPU."""
    from relu2_impls import fused as op

    info = op.build()
    cuda = info.cuda and x.device.type == "cuda"
    libraries = sorted(info.directory.glob("*.so"))
    return Kernel("relu2_kernel", "cuda" if cuda else "cpp", source=str(op.source_dir()),
                  binary=str(libraries[0]) if cuda and libraries else "")


def _triton_kernel(x) -> Kernel:
    from relu2_impls import triton_kernel

    grid = -(-x.numel() // triton_kernel.BLOCK)
    return Kernel("_relu_squared_kernel", "triton",
                  launch=f"BLOCK={triton_kernel.BLOCK} num_warps={triton_kernel.NUM_WARPS} grid=({grid},)")


class _constant:
    """A fingerprint that is the same for every input (a built or hand-written kernel); picklable."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __call__(self, x) -> str:
        return self.value


def _source_hash(module) -> str:
    """A fingerprint for a kernel written in Python: the hash of the module that holds it, less its
    comments and blank lines (Python's own tokens: a comment compiles to the same kernel)."""
    import hashlib
    import inspect
    import io
    import tokenize

    skipped = (tokenize.COMMENT, tokenize.NL)
    tokens = tokenize.generate_tokens(io.StringIO(inspect.getsource(module)).readline)
    code = "\n".join(f"{t.type} {t.string}" for t in tokens if t.type not in skipped)
    return hashlib.sha256(code.encode()).hexdigest()[:16]
