"""relu2 inspect: what ran for a cell, read from the generated and compiled code."""

from __future__ import annotations

import pytest

from conftest import requires_cuda
from relu2 import cli
from relu2.show.inspect import explain, ptx_accesses, sass_accesses, wrapper_kernels

PTX = """
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    @%p2 ld.global.L1::evict_last.b16 { %rs1 }, [ %rd2 + 0 ];
    @%p1 st.global.v4.b32 [ %rd3 + 0 ], { %r5, %r6, %r7, %r8 };
    ld.param.u64 %rd4, [param_0];
"""
SASS = """
        /*0090*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*00a0*/                   LDG.E.U16 R8, desc[UR4][R6.64] ;
        /*0100*/                   STG.E.128 desc[UR4][R10.64], R4 ;
        /*0110*/                   STG.E desc[UR4][R12.64], R9 ;
"""


def test_ptx_widths_are_lanes_times_element_bits():
    found = {(a.op, a.bits): a.count for a in ptx_accesses(PTX)}
    assert found == {("load", 128): 1, ("load", 16): 1, ("store", 128): 1}  # ld.param is not global


def test_sass_widths():
    found = {(a.op, a.bits): a.count for a in sass_accesses(SASS)}
    assert found == {("load", 128): 1, ("load", 16): 1, ("store", 128): 1, ("store", 32): 1}


def test_wrapper_kernels_are_found_in_inductor_wrapper_code():
    code = ("x = 1\ntriton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', '''\n@triton.jit\ndef k(): pass\n''',"
            " device_str='cuda')\ncpp_fused_1 = async_compile.cpp_pybinding(['float*'], r'''\nextern \"C\" void kernel() {}\n''')\n")
    assert [(n, lang) for n, lang, _ in wrapper_kernels(code)] == [("triton_poi_fused_0", "triton"), ("cpp_fused_1", "cpp")]


@pytest.mark.slow
def test_inspect_shows_the_generated_cpu_code_of_a_compiled_path():
    static = explain("compile", "float32", (64, 128), "cpu")
    dynamic = explain("compile_dynamic", "float32", (64, 128), "cpu")
    assert static.agreement.startswith("ok") and dynamic.agreement.startswith("ok")
    assert static.fingerprint and dynamic.fingerprint and static.fingerprint != dynamic.fingerprint
    assert dynamic.warmup == "16384x128" and not static.warmup
    (kernel,) = dynamic.kernels
    assert kernel.language == "cpp" and "Vectorized<float>" in kernel.source
    assert "ks0" in kernel.source  # dynamic: the size is a runtime symbol
    (kernel,) = static.kernels
    assert "8192" in kernel.source and "ks0" not in kernel.source  # static: 64 x 128 is baked in


def test_inspect_command_line(capsys):
    assert cli.main(["inspect", "eager", "--shape", "4096", "--dtype", "float32", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "eager on float32 4096 (cpu)" in out and "no generated code" in out
    with pytest.raises(SystemExit):
        cli.main(["inspect", "eager", "--shape", "0x5"])
    assert "every dimension must be >= 1" in capsys.readouterr().err
    assert cli.main(["inspect", "nope", "--shape", "4"]) == 2
    assert "unknown implementation 'nope'" in capsys.readouterr().err


def test_inspect_of_a_cell_that_disagrees_with_eager_is_a_finding(monkeypatch, capsys):
    """Exit 1, as relu2 check's: the inspection is printed all the same, the disagreement on its line."""
    from relu2.measure import cell as measure
    from relu2.measure.agreement import AgreementError

    def disagrees(impl, cell, device, seconds=None):
        raise AgreementError("3 of 4096 elements differ")

    monkeypatch.setattr(measure, "prepare_and_check", disagrees)
    assert cli.main(["inspect", "eager", "--shape", "4096", "--dtype", "float32", "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    assert "agreement:   FAILED: 3 of 4096 elements differ" in captured.out
    assert captured.err.strip().splitlines()[-1] == "relu2 inspect: eager float32 4096 disagrees with eager (agreement, above)"


@requires_cuda
@pytest.mark.cuda
def test_gpu_inspect_reads_load_widths_from_ptx_and_sass():
    fused = explain("fused", "bfloat16", (4096, 4096), "cuda")
    assert len(fused.launched) == 1 and any(a.bits == 128 for a in fused.kernels[0].accesses)
    static = explain("compile", "bfloat16", (4096, 4096), "cuda")
    (kernel,) = static.kernels
    assert kernel.language == "triton" and "@triton.jit" in kernel.source and kernel.launch
    assert any(a.op == "load" and a.bits == 128 for a in kernel.accesses)


def test_inspect_takes_a_measurements_own_steps(monkeypatch):
    """relu2 inspect calls measure's prepare/agreement/fingerprint and isolation's private caches,
    rather than a copy of them that could drift from what a sweep measures (issue 19)."""
    import os

    from relu2.measure import isolation
    from relu2.measure import cell as measure

    calls = []
    prepare_and_check, private_caches = measure.prepare_and_check, isolation.private_caches

    def spy_prepare(impl, cell, device, seconds=None):
        calls.append(("prepare_and_check", cell.describe(), os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")))
        return prepare_and_check(impl, cell, device, seconds)

    def spy_caches(*args, **kwargs):
        calls.append(("private_caches",))
        return private_caches(*args, **kwargs)

    monkeypatch.setattr(measure, "prepare_and_check", spy_prepare)
    monkeypatch.setattr(isolation, "private_caches", spy_caches)
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    result = explain("eager", "float32", (4, 1024), "cpu")
    assert [c[0] for c in calls] == ["private_caches", "prepare_and_check"]
    assert calls[1][1] == "eager float32 4x1024" and "relu2-inspect-" in calls[1][2]
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before  # restored after
    assert result.agreement.startswith("ok") and result.fingerprint == ""


def test_the_work_of_a_call_is_each_kernel_s_launch_and_exact_counters():
    """What inspect prints of a call's work, from the counts recorded on the H200 (docs/aa)."""
    from pathlib import Path

    from relu2.records.work import read_report
    from relu2.show.inspect import format_work
    from relu2.vocab.schema import Cell

    recorded = read_report(Path(__file__).resolve().parents[1] / "docs/aa/counters-h200-2026-12-03/box-a/smoke")
    text = format_work(recorded.work(Cell("eager", "bfloat16", 1024, (1024,))))
    assert text.startswith("work counters (Nsight Compute, one call, exact): 2 kernel(s)")  # clamp, then pow
    fused = format_work(recorded.work(Cell("fused", "bfloat16", 1024, (1024,))))
    assert "relu2_kernel<__nv_bfloat16, 8>  grid (1, 1, 1)" in fused and "instructions 336, global_loads 4" in fused


def test_without_cuda_inspect_says_why_the_work_is_not_counted(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("there is a GPU here")
    from relu2.show.inspect import counted_work
    from relu2.vocab.schema import Cell

    assert counted_work(Cell("eager", "float32", 1024, (1024,)), "cpu").startswith("work counters: not measured here:")
