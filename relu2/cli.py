"""The ``relu2`` console script (also ``python -m relu2``): one subcommand per workflow.

Heavy imports (torch, matplotlib, asv) happen inside the subcommands, so ``relu2 --help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

DTYPE_NAMES = ("float32", "float16", "bfloat16")


def parse_size(text: str) -> int:
    """'1024', '2^20', '4K', '16M' -> number of elements."""
    t = text.strip().upper()
    try:
        if "^" in t:
            base, exp = t.split("^")
            return int(base) ** int(exp)
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
        return int(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4096, 2^20, 64K, 16M)") from None


def _csv_list(choices: Sequence[str] | None = None):
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if choices is not None and s not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices or ())}; got {text!r}")
        return items

    return parse


def _sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _hostname(device: str) -> str:
    import socket

    if device == "cuda":
        import torch

        return torch.cuda.get_device_name().replace(" ", "-").lower()
    return socket.gethostname()


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --- subcommands ---------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    import relu2
    from relu2 import timing
    from relu2.machine import machine_info

    device = args.device or _default_device()
    for key, value in machine_info().items():
        print(f"{key:<12}{value}")
    print(f"{'device':<12}{device}")
    print(f"{'cache':<12}{timing.l2_bytes(device) / 2**20:.0f} MiB ({'L2' if device == 'cuda' else 'last-level'})")
    if not args.no_bandwidth:
        print(f"{'copy':<12}{timing.copy_bandwidth(device):.0f} GB/s (device copy, bytes read + written)")
    print("\nimplementations:")
    for name, impl in relu2.implementations().items():
        why = impl.why_not(device)
        state = "available" if not why else f"unavailable: {why.splitlines()[0][:200]}"
        print(f"  {name:<16}{state}")
    del torch
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import torch

    import relu2
    from relu2.inputs import agreement_cases

    device = args.device or _default_device()
    impls = relu2.implementations()
    names = args.impl or [n for n, i in impls.items() if i.is_relu2]
    unknown = [n for n in names if n not in impls]
    if unknown:
        print(f"relu2 check: unknown implementation(s): {', '.join(unknown)}; known: {', '.join(impls)}", file=sys.stderr)
        return 2
    failures: list[str] = []
    print(f"agreement with the eager native path, bitwise, on {device}")
    print(f"{'impl':<18}" + "".join(f"{d:<12}" for d in args.dtype))
    for name in names:
        impl = impls[name]
        cells = []
        for dtype_name in args.dtype:
            if not impl.supports(device):
                cells.append("n/a")
                continue
            bad = 0
            for case in agreement_cases(getattr(torch, dtype_name), device):
                try:
                    relu2.check_agreement(impl, case.x)
                except Exception as e:  # AgreementError, or the implementation crashed
                    bad += 1
                    failures.append(f"{name} {dtype_name} [{case.label}]: {e}")
            cells.append("ok" if not bad else f"FAIL({bad})")
        print(f"{name:<18}" + "".join(f"{c:<12}" for c in cells))
    for name in names:
        if not impls[name].supports(device):
            print(f"  n/a {name}: {impls[name].why_not(device).splitlines()[0][:200]}")
    for f in failures:
        print(f"  FAIL {f}")
    return 1 if failures else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import torch

    import relu2
    from relu2 import plot, sweep
    from relu2.report import format_table
    from relu2.results import ROOFLINE_IMPL, write_csv

    device = args.device or _default_device()
    if device == "cuda" and not torch.cuda.is_available():
        print("relu2 sweep: --device cuda asked for, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    known = relu2.implementations()
    unknown = [n for n in (args.impl or []) if n not in known]
    if unknown:
        print(f"relu2 sweep: unknown implementation(s): {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    names = args.impl or list(known)
    if ROOFLINE_IMPL not in names:
        names.append(ROOFLINE_IMPL)  # the roofline every figure is compared with
    sizes = args.sizes or sweep.default_sizes(device)
    cells = sweep.default_cells(names, args.dtype, sizes)
    if args.model_shapes:
        cells += sweep.model_cells(names)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"relu2 sweep: {len(cells)} cells x {len(args.modes)} modes on {device}; writing {out}/", file=sys.stderr)
    # Rows are checkpointed here input by input, so Ctrl-C (or a kill) loses at most the input
    # being measured, and the same command run again measures only what is missing.
    partial = out / "sweep.partial.csv"
    try:
        rows = sweep.run_resumable(cells, args.modes, device, args.machine or _hostname(device), _git_commit(),
                                   partial, progress=not args.no_progress)
    except KeyboardInterrupt:
        kept = f"the inputs measured so far are kept in {partial}" if partial.exists() else "nothing was measured yet"
        print(f"\nrelu2 sweep: interrupted; {kept}. Run the same command again (same --out, commit and "
              "machine) to resume from there.", file=sys.stderr)
        return 130
    write_csv(rows, out / "sweep.csv")
    print(format_table(rows))
    written = plot.plot_all(rows, out)
    # Removed only now: were the table or the plots interrupted, a re-run still resumes at once.
    partial.unlink(missing_ok=True)
    print(f"\nwrote {out / 'sweep.csv'} and {len(written)} plot files in {out}/")
    failed = [r for r in rows if r.status == "failed"]
    if failed:
        print(f"{len(failed)} figures FAILED (not timed): see the table above", file=sys.stderr)
    return 1 if failed else 0


def _load_rows(source: Path, machine: str | None, commit: str | None):
    from relu2 import asv_results
    from relu2.results import read_csv

    if source.is_file():
        rows = read_csv(source)
        if machine:
            rows = [r for r in rows if r.machine == machine]
        if commit:
            rows = [r for r in rows if r.commit.startswith(commit)]
        return rows
    return asv_results.load_rows(source, machine=machine, commit=commit)


def cmd_plot(args: argparse.Namespace) -> int:
    from relu2 import plot

    source = Path(args.source)
    if not source.exists():
        print(f"relu2 plot: {source} does not exist", file=sys.stderr)
        return 2
    rows = _load_rows(source, args.machine, None)
    if not rows:
        print(f"relu2 plot: no results in {source}", file=sys.stderr)
        return 2
    written = plot.plot_all(rows, Path(args.out), commit=args.commit)
    for path in written:
        print(path)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from relu2 import asv_results

    n = asv_results.export_csv(Path(args.results), args.out, machine=args.machine)
    if args.out:
        print(f"wrote {n} rows to {args.out}", file=sys.stderr)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from relu2 import gate

    report = gate.gate(Path(args.results), args.base, args.head, machine=args.machine, factor=args.factor)
    print(report.format())
    return report.exit_code


def cmd_asv(args: argparse.Namespace) -> int:
    from relu2 import asv_run

    argv = list(args.asv_args)
    if argv[:1] == ["--"]:  # `relu2 asv -- --version`: options asv takes before its command
        argv = argv[1:]
    return asv_run.main(argv)


def cmd_build(args: argparse.Namespace) -> int:
    from relu2 import fused

    info = fused.build(verbose=args.verbose)
    kind = "CUDA + CPU" if info.cuda else "CPU only"
    how = "loaded from cache" if info.cached else "built"
    print(f"fused extension ({kind}) {how} in {info.seconds:.1f} s: {info.directory}")
    return 0


# --- parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relu2",
        description="Benchmark and regression-track relu²(x) = relu(x)²: a fused kernel against eager "
        "and torch.compile, agreement checked bitwise before every timing.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="device, versions, cache size, copy bandwidth, implementations",
                       description="Show the device, library versions, L2 (or CPU last-level cache) size, the "
                       "measured device-copy bandwidth, and which implementations are available here and why not.")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when present, else cpu")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the copy-bandwidth measurement")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("check", help="the bitwise agreement matrix; exit 1 on any disagreement",
                       description="Run every implementation on the full input matrix (random normals mixed with "
                       "NaN, ±inf, ±0, subnormals, overflowing squares; odd sizes; sliced, transposed and offset "
                       "views) and compare with torch.square(F.relu(x)) bit for bit. Exit 1 on any disagreement.")
    p.add_argument("--impl", type=_csv_list(), help="comma-separated implementations (default: all relu² ones)")
    p.add_argument("--dtype", type=_csv_list(DTYPE_NAMES), default=list(DTYPE_NAMES), help="default: all three")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when present, else cpu")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("sweep", help="agreement then timing over a grid of sizes; CSV, table and plots",
                       description="For every implementation x dtype x size: check agreement on fresh inputs, "
                       "then time it (hot: CUDA-graph replay, L2 warm; cold: inputs not cache-resident; launch: "
                       "back-to-back eager calls). Writes DIR/sweep.csv (the columns of `relu2 export`) and plots, "
                       "prints a table. Runs on the CPU when there is no GPU. Exit 1 if any cell failed agreement. "
                       "Interrupted, it keeps what it measured in DIR/sweep.partial.csv; the same command again "
                       "resumes.")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when present, else cpu")
    p.add_argument("--impl", type=_csv_list(), help="comma-separated implementations (default: all; copy always)")
    p.add_argument("--dtype", type=_csv_list(DTYPE_NAMES), default=list(DTYPE_NAMES), help="default: all three")
    p.add_argument("--sizes", type=_sizes, help="comma-separated numels, e.g. 2^10,2^16,16M "
                   "(default: 2^10..2^28 every factor 4 on CUDA, up to 2^22 on CPU)")
    p.add_argument("--modes", type=_csv_list(("hot", "cold", "launch")), default=["hot", "cold", "launch"],
                   help="comma-separated timing modes (default: hot,cold,launch)")
    p.add_argument("--model-shapes", action="store_true", help="also time (tokens x hidden) bf16 model shapes")
    p.add_argument("--machine", default=None, help="machine name recorded in the CSV (default: hostname)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plot", help="latency, bandwidth, speed-up and history plots",
                       description="Plot latency vs size (with the memory floor), achieved GB/s (with the copy "
                       "ceiling), speed-up over eager, and the history of cells across commits, as PNG and SVG, "
                       "from an asv results directory or a sweep.csv.")
    p.add_argument("source", help="asv results directory (e.g. results/) or a sweep.csv")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--commit", help="commit (prefix) to plot; default: the latest")
    p.add_argument("--machine", help="machine to plot; default: the only one, or all")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("export", help="asv results to a tidy CSV",
                       description="Write the asv results under RESULTS_DIR as a tidy CSV (machine, commit, date, "
                       "impl, dtype, numel, shape, mode, median_s, q25_s, q75_s, bytes, gbps, roofline_fraction, "
                       "status, reason) to --out, or to stdout.")
    p.add_argument("results", metavar="RESULTS_DIR")
    p.add_argument("--out", help="CSV file to write (default: stdout)")
    p.add_argument("--machine", help="only this machine")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("gate", help="fail (exit 1) when HEAD is slower than BASE or newly fails",
                       description="Compare two commits' recorded asv results. Prints cells slower than "
                       "BASE by more than --factor (and significant by asv's statistics where samples exist) and "
                       "cells that newly fail. Exit 1 if there are any, 0 if none, 2 on unusable input.")
    p.add_argument("base", metavar="BASE", help="base commit (hash or prefix)")
    p.add_argument("head", metavar="HEAD", help="head commit (hash or prefix)")
    p.add_argument("--results", default="results", help="asv results directory (default: results)")
    p.add_argument("--machine", help="machine name (default: the only one)")
    p.add_argument("--factor", type=float, default=1.05, help="slow-down ratio that counts (default: 1.05)")
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("asv", help="run asv with atomic result writes; e.g. relu2 asv run --skip-existing-commits A..B",
                       description="Run asv (same commands and options) with its JSON files written atomically: "
                       "to a temporary file in the same folder, then renamed over the old one, so a run killed "
                       "mid-write leaves the previous file or none, never half a file. asv saves a commit's results "
                       "once all its benchmarks have run; to resume an interrupted `relu2 asv run A..B`, run "
                       "`relu2 asv run --skip-existing-commits A..B`: the commits already saved are skipped and the "
                       "one that was interrupted is measured again. Options asv takes before its command (-v, "
                       "--config) go after it (relu2 asv run -v ...), or after -- (relu2 asv -- --version).")
    p.add_argument("asv_args", nargs=argparse.REMAINDER, metavar="ASV_ARGS", help="asv's command and options")
    p.set_defaults(func=cmd_asv)

    p = sub.add_parser("build", help="build the fused extension ahead of time",
                       description="JIT-build the fused kernel (CUDA when a GPU is present, the C++ CPU twin "
                       "always) into the cache keyed by the hash of its sources and flags, and say where and how "
                       "long it took. Later processes load it in about a second.")
    p.add_argument("--verbose", action="store_true", help="show the compiler's output")
    p.set_defaults(func=cmd_build)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    from relu2.asv_results import ResultsError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ResultsError as e:  # unusable results folder or file: the message names it
        print(f"relu2 {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError) as e:  # a bad path or a malformed file: say which, no traceback
        print(f"relu2 {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
