"""The ``relu2`` console script (also ``python -m relu2``): one subcommand per workflow.

This module parses and dispatches.  The work lives in the modules named in each ``cmd_*``; heavy
imports (torch, matplotlib, asv) happen there, so ``relu2 --help`` never imports torch.

Exit codes: 0 success; 1 a finding (a disagreement, a failed cell, a regression); 2 unusable input
(one line on stderr, nothing written); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Sequence

from relu2 import __version__
from relu2.host import busy as quiet
from relu2.host import git, lifecycle, machine, outputs
from relu2.host.files import atomic_write_text
from relu2.host.outputs import name_part
from relu2.host.proc import ProcessFailed
from relu2.judge import gate, learn, noise
from relu2.judge.report import format_spread
from relu2.measure import counters, sweep
from relu2.measure.isolation import timeout_from_env
from relu2.measure.sweep import check_fits
from relu2.records import asv_results, compare_folder, work
from relu2.records.asv_results import resolve_commit
from relu2.records.rows import flag_outliers, read_csv
from relu2.runs import asv_run, bisect, compare, confirm, sweep_job
from relu2.runs.confirm import parse_target
from relu2.show import publish
from relu2.show.inspect import counted_work, explain, format_explanation
from relu2.show.table import format_matrix
from relu2.vocab import schema
from relu2.vocab.errors import Refused, UsageError, WriteError

# Sizes above this are refused when parsing: no device holds 2 x 2^40 elements.
MAX_NUMEL = 2**40
SIZE_FORMS = "a positive number of elements: 4096, 2^20, 64K, 16M or 1G"


def parse_size(text: str) -> int:
    """'1024', '2^20', '4K', '16M' -> number of elements, between 1 and 2^40."""
    t = text.strip().upper()
    match = re.fullmatch(r"(\d+)\^(\d+)|(\d+)([KMG]?)", t)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use {SIZE_FORMS})")
    if match.group(1) is not None:
        numel = int(match.group(1)) ** int(match.group(2)) if int(match.group(2)) <= 64 else MAX_NUMEL + 1
    else:
        numel = int(match.group(3)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(4)]
    if numel < 1:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} is {numel} elements (use {SIZE_FORMS})")
    if numel > MAX_NUMEL:
        raise argparse.ArgumentTypeError(f"size {text!r} is more than 2^40 elements: no device holds it")
    return numel


def _sizes(text: str) -> list[int]:
    tokens = [s for s in text.split(",")]
    if not any(s.strip() for s in tokens):
        raise argparse.ArgumentTypeError(f"no sizes in {text!r} (use a comma-separated list of {SIZE_FORMS})")
    return [parse_size(s) for s in tokens if s.strip()]


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = schema.parse_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if math.prod(shape) > MAX_NUMEL:
        raise argparse.ArgumentTypeError(f"shape {text!r} is more than 2^40 elements: no device holds it")
    return shape


def _csv_list(choices: Sequence[str] | None = None):
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if choices is not None and s not in choices]
        if bad or not items:
            expected = f"a comma-separated list of {', '.join(choices)}" if choices else "a comma-separated list"
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return list(dict.fromkeys(items))

    return parse


def _number(kind: type, minimum: float = 0.0, strict: bool = True, maximum: float | None = None):
    """A finite number above ``minimum`` (or at least it, ``strict=False``) and at most ``maximum``: a count
    or a time that no run could finish is refused, not started; the error echoes the text as typed."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if not math.isfinite(value):  # inf and nan parse as floats, and then time nothing
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g}, got {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {text!r}")
        return value

    return parse


def _positive(kind: type, maximum: float | None = None):
    return _number(kind, maximum=maximum)


def _out_dir(text: str) -> str:
    """An output folder; an empty name would write into the current folder unasked."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"not a folder: {text!r} (name the output folder)")
    return text


def _out_file(text: str) -> str:
    """An output file; an empty name is no file."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"not a file: {text!r} (name the output file)")
    return text


def _nonempty(option: str):
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty {option}: name one, or leave the option out")
        return text

    return parse


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no names in {text!r} (a comma-separated list, e.g. Grid,ModelShapes)")
    return names


COMPARE_DOC = """\
Measure BASE and HEAD on this machine, side by side, and judge HEAD against BASE on paired figures.

What is measured: both commits' packages, built from git worktrees with no network (each installed
into a folder of its own), measured by this checkout's instrument (its relu2 package and
benchmarks/, copied once), every cell of the chosen suites.

How rounds are ordered: ROUNDS rounds; in each, a fresh process per side measures every cell once
(its median is the round's figure). The order alternates, ABBA: base, head | head, base | base,
head ... so neither side always runs first, and a drift of the box falls on both.

What is paired: head round i with base round i, measured one after the other on one box. Both
sides are written as plain asv results (DIR/base/, DIR/head/: samples one median per round, in round
order) with DIR/compare.json. Each round is kept in DIR/rounds/ as it ends: a compare that dies or
is stopped (Ctrl-C) loses no measured round, and --resume --out DIR measures only the rest.

Cells whose work changed: on CUDA with Nsight Compute the cells whose kernel differs are counted
once a side (DIR/work.json). A cell whose exact work changed is judged by the GPU's same-box model
at its share among such cells; while its rounds settle nothing (neither beyond its bar nor clear
of the smallest slowdown its band must tell), it is measured again, those cells only, 3 rounds at a
time on the same ABBA order, up to 12 a side (DIR/compare.json added_rounds).

The verdict (relu2 gate --compare DIR, run after measuring): a cell moved by the median over rounds
of head round i / the median of base rounds i-1..i+1, judged against the same-box noise model of
this GPU (learned by relu2 noise learn --same-box from A/A compares), or --factor. A GPU without a
same-box model is judged with its cross-box one (wider); a GPU with neither is refused before
anything is measured (exit 2), unless --factor or --measure-only; a CPU without one is reported,
not gated.
The report names the model and prints its resolution for these cells (the smallest slowdown caught
in 90% of no-change cases); it is written to DIR/report.txt|md|json. Exit 0 pass, 1 a finding (a
regression, a failed or vanished cell, a round that did not complete), 2 unusable input (one line,
nothing written), 130 interrupted. --measure-only stops before the verdict (exit 0 when measured).

Cost: a round of a side costs what a measurement of one commit in one round costs
(docs/compare.md; figures: docs/lab/provenance.md); the CPU quick grid (RELU2_BENCH_QUICK=1 --suites Grid) takes about a minute.
"""


def _target(text: str):
    try:
        return parse_target(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _fail(command: str, message: str) -> int:
    print(f"relu2 {command}: {message}", file=sys.stderr)
    return 2


# --- subcommands ---------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    from relu2.measure import registry, timing

    device = machine.resolve_device(args.device)
    for key, value in machine.machine_info().items():
        print(f"{key:<12}{value}")
    print(f"{'device':<12}{device}")
    print(f"{'cache':<12}{timing.l2_bytes(device) / 2**20:.0f} MiB ({'L2' if device == 'cuda' else 'last-level'})")
    if not args.no_bandwidth:
        numel = max(schema.default_sizes(device))
        gbps = timing.copy_bandwidth(device, numel)
        print(f"{'copy':<12}{gbps:.0f} GB/s (the roofline: copy of {numel} bfloat16 elements, hot; "
              "bytes read + written)")
    print("\nimplementations:")
    for name, impl in registry.implementations().items():
        why = impl.why_not(device)
        state = "available" if not why else f"{'BROKEN' if impl.broken else 'unavailable'}: {why.splitlines()[0][:200]}"
        print(f"  {name:<22}{state}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from relu2.measure import registry
    from relu2.measure.agreement import agreement_matrix

    device = machine.resolve_device(args.device)
    impls = registry.implementations()
    names = args.impl or [n for n, i in impls.items() if i.is_relu2]
    unknown = [n for n in names if n not in impls]
    if unknown:
        return _fail("check", f"unknown implementation(s): {', '.join(unknown)}; known: {', '.join(impls)}")
    not_relu2 = [n for n in names if not impls[n].is_relu2]
    if not_relu2:
        return _fail("check", f"{', '.join(not_relu2)} is a reference, not relu², and has no agreement to check")
    named_absent = [n for n in (args.impl or []) if not impls[n].supports(device) and not impls[n].broken]
    if named_absent:
        reasons = "; ".join(f"{n}: {impls[n].why_not(device).splitlines()[0]}" for n in named_absent)
        return _fail("check", f"cannot run here ({device}): {reasons}")
    matrix = agreement_matrix(names, args.dtype, device)
    print(format_matrix(matrix))
    return 1 if matrix.failed else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    device = machine.resolve_device(args.device)
    machine.check_label(args.machine)
    timeout_s = timeout_from_env()  # checked even under --timeout: one variable, one meaning, everywhere
    # Its own folder in progress (a stopped sweep's, or one still running, which the lock itself then
    # refuses by name) is no folder of someone else's.
    outputs.claim_dir(args.out, force=args.force, resume=sweep_job.resumable)
    names = sweep_job.implementations(args.impl, sweep.registered_names(), None if args.impl else sweep.default_names())
    cells = sweep_job.plan_cells(names, args.dtype, args.sizes or schema.default_sizes(device), grid=not args.no_grid,
                                 model_shapes=args.model_shapes, vllm_shapes=args.vllm_shapes, nemotron=args.nemotron)
    plan = sweep_job.Plan(device=device, cells=tuple(cells), modes=tuple(args.modes), named=tuple(args.impl or ()),
                          out=Path(args.out), machine=args.machine or machine.machine_name(device),
                          samples=args.samples, sample_ms=args.sample_ms,
                          timeout_s=args.timeout or timeout_s, isolate=not args.in_process,
                          progress=not args.no_progress, require_idle=args.require_idle)
    return sweep_job.run(plan)


def _load_rows(source: Path, machine_name: str | None):
    if source.is_file():
        rows = read_csv(source)
        return [r for r in rows if r.machine == machine_name] if machine_name else rows
    return flag_outliers(asv_results.load_rows(source, machine=machine_name))


def cmd_plot(args: argparse.Namespace) -> int:
    from relu2.show import plot

    source = Path(args.source)
    if not source.exists():
        return _fail("plot", f"{source} does not exist")
    outputs.claim_dir(args.out, force=args.force)
    rows = _load_rows(source, args.machine)
    if not rows:
        return _fail("plot", f"no results in {source}")
    commit = args.commit
    if commit and not source.is_file():
        commit = resolve_commit(source, commit, args.machine)
    elif commit:
        commit = git.try_resolve(commit, git.toplevel(source)) or commit
    out = Path(args.out)  # made only once there is a plot
    drawn = plot.plot_all(rows, out, commit=commit, repo=git.toplevel(source))
    for path in drawn:
        print(path)
    plot.say_missing(drawn, "relu2 plot")
    return 1 if "all" in drawn.missing else 0  # a plot command that draws nothing has a finding


def cmd_export(args: argparse.Namespace) -> int:
    if args.out:
        outputs.claim_file(args.out, force=args.force)
    n = asv_results.export_csv(Path(args.results), args.out, machine=args.machine, commit=args.commit)
    if args.out:
        print(f"wrote {n} rows to {args.out}", file=sys.stderr)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    argv = list(args.asv_args)
    html = publish.publish(args.config, argv[1:] if argv[:1] == ["--"] else argv)
    print(f"relu2 publish: the dashboard is in {html}/ (serve it: python -m http.server --bind 127.0.0.1 "
          f"--directory {html} 8080)", file=sys.stderr)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    floor_s = None if args.floor_us is None else args.floor_us * 1e-6
    if args.compare:
        extra = [f for f, v in (("BASE", args.base), ("--results", args.results), ("--machine", args.machine),
                                ("--base-machine", args.base_machine),
                                ("--head-machine", args.head_machine), ("--across-gpus", args.across_gpus)) if v]
        if extra:
            return _fail("gate", f"--compare DIR names its own commits and box: {', '.join(extra)} does not go with it")
        report = gate.gate_compare(args.compare, factor=args.factor, floor_s=floor_s, gate_launch=args.gate_launch,
                                   allow_missing=args.allow_missing, with_spread=args.spread,
                                   across_versions=args.across_versions, allow_failed_base=args.allow_failed_base,
                                   confirmed=args.confirmed, noise_model=args.noise_model,
                                   expect_gpu=args.expect_gpu, plan=args.plan)
    else:
        if not (args.base and args.head):
            return _fail("gate", "give BASE and HEAD, or --compare DIR")
        if args.expect_gpu is not None or args.plan is not None:
            return _fail("gate", "--expect-gpu and --plan check a compare folder: they go with --compare DIR")
        report = gate.gate(Path(args.results or "results"), args.base, args.head, machine=args.machine, factor=args.factor,
                           base_machine=args.base_machine, head_machine=args.head_machine, floor_s=floor_s,
                           gate_launch=args.gate_launch, allow_missing=args.allow_missing, with_spread=args.spread,
                           across_gpus=args.across_gpus, across_versions=args.across_versions,
                           allow_failed_base=args.allow_failed_base, confirmed=args.confirmed,
                           noise_model=args.noise_model)
    print(report.render(args.format))
    if args.spread and args.format != "json":  # the JSON holds it as "spread": one document on stdout
        print("\nSPREAD (head/base per implementation and mode, over the cells ok in both)")
        print(format_spread(report.spread, markdown=args.format == "markdown"))
    return report.exit_code


def cmd_compare(args: argparse.Namespace) -> int:
    if args.resume and not args.out:
        raise UsageError("--resume needs --out DIR: the incomplete compare to continue")
    out = Path(args.out) if args.out else compare_folder.default_out()
    machine.check_label(args.machine)
    if args.noise_model or os.environ.get("RELU2_NOISE_MODEL"):
        noise.load_models(args.noise_model)  # a model that does not read is refused before anything is measured
    if not args.measure_only and args.factor is None:
        compare.check_judgeable(args.device, args.noise_model, resume=args.resume)
    # What resuming needs repeated: without them a GPU with no noise model would be refused.
    judged_by = " --measure-only" if args.measure_only else f" --factor {args.factor:g}" if args.factor else ""

    def saved() -> str:
        return (f"{compare_folder.kept_rounds(out)} rounds are kept in {out / compare_folder.ROUNDS_DIR} (compare.json: complete false; "
                f"--resume --out {out}{judged_by} measures the rest)" if (out / compare_folder.COMPARE_FILE).exists()
                else "nothing was written")

    with lifecycle.guard("relu2 compare", saved):
        compare.measure(args.base, args.head, out, repo=args.repo, suites=args.suites, rounds=args.rounds,
                        machine=args.machine, device=args.device, require_idle=args.require_idle,
                        resume=args.resume)
    if args.measure_only:
        print(f"relu2 compare: measured, not judged (--measure-only): relu2 gate --compare {out}")
        return 0
    report, code = compare.judge(out, args.format, factor=args.factor, noise_model=args.noise_model)
    print(report)
    return code


def _repo(named: str | None) -> Path | None:
    """The git checkout ``--repo`` names, else the one here; None when that is no checkout."""
    where = Path(named) if named else Path.cwd()
    return git.toplevel(where) if where.is_dir() else None


def _same_commits(report: dict, base: str, head: str, repo: str | None, what: str) -> None:
    """UsageError when a gate report judged other commits than BASE and HEAD (its cells would be measured
    against commits it never saw)."""
    where = _repo(repo)
    for side, ref in (("base", base), ("head", head)):
        entry = report.get(side) or {}
        if not isinstance(entry, dict):
            raise UsageError(f"{what}: not a relu2 gate JSON report (its {side} is not an object)")
        recorded = str(entry.get("commit") or "")
        sha = git.try_resolve(ref, where) if where else None
        if recorded and sha and not (sha.startswith(recorded) or recorded.startswith(sha)):
            raise UsageError(f"{what} judged {side} {recorded[:8]}, not {ref} ({sha[:8]}): give the "
                                     "commits it judged, or --cell")


def cmd_confirm(args: argparse.Namespace) -> int:
    targets, not_cells = list(args.cell), []
    if args.from_gate:
        try:
            report = json.loads(Path(args.from_gate).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return _fail("confirm", f"{args.from_gate}: not a relu2 gate JSON report ({type(e).__name__}: {e})")
        if not isinstance(report, dict) or not isinstance(report.get("regressions"), list):
            return _fail("confirm", f"{args.from_gate}: not a relu2 gate JSON report (no list of regressions)")
        _same_commits(report, args.base, args.head, args.repo, "--from-gate " + args.from_gate)
        try:
            targets += confirm.targets_from_gate(report)
            not_cells = confirm.not_cells_in_gate(report)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            return _fail("confirm", f"{args.from_gate}: not a relu2 gate JSON report ({type(e).__name__}: {e})")
    if not_cells:
        print(f"relu2 confirm: not re-measured: {', '.join(not_cells)} (not one cell's time: a summary "
              "over Grid cells or a memory figure; the gate still fails on it: confirm the cells behind it with --cell)", file=sys.stderr)
    if not targets:
        if not_cells:  # only summaries: named above, work not done
            print("relu2 confirm: nothing else to re-measure: the gate report flags no cell")
            return 1
        return _fail("confirm", "nothing to re-measure: no --cell, and " +
                     (f"{args.from_gate} flags no cell" if args.from_gate else "no --from-gate report"))
    machine.check_label(args.machine)
    if args.out:
        outputs.claim_file(args.out, force=args.force)
    repo = _repo(args.repo)
    if repo is None:
        return _fail("confirm", f"{args.repo or Path.cwd()}: not a git checkout (run it inside the one that holds "
                     "both commits, or name it with --repo)")
    device = machine.resolve_device(args.device)
    quiet.before_measuring("relu2 confirm", args.require_idle, gpu=device == "cuda")  # UsageError: exit 2
    with lifecycle.guard("relu2 confirm", lambda: f"nothing was written{' to ' + args.out if args.out else ''} "
                         "(the rounds are written once all are measured)"):
        report = confirm.confirm(repo, args.base, args.head, targets, args.rounds, device,
                                 progress=not args.no_progress, machine=args.machine or "")
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=2, allow_nan=False, default=str) + "\n")
    print(confirm.format_confirmation(report))
    missing = confirm.not_measured(report)
    if missing:
        print(f"relu2 confirm: no figure on a side for {', '.join(missing)} (the reasons are above)", file=sys.stderr)
    return 1 if not_cells or missing else 0


def cmd_bisect(args: argparse.Namespace) -> int:
    targets = list(args.cell)
    if args.from_gate:
        source = Path(args.from_gate)
        source = source / "report.json" if source.is_dir() else source  # a relu2 compare folder's verdict
        try:
            targets += confirm.targets_from_gate(json.loads(source.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return _fail("bisect", f"{source}: not a relu2 gate JSON report ({type(e).__name__}: {e})")
    if not targets:
        return _fail("bisect", "no cell to follow: name one with --cell IMPL:DTYPE:SHAPE:MODE, or --from-gate a "
                     "report that flags one")
    repo = _repo(args.repo)
    if repo is None:
        return _fail("bisect", f"{args.repo or Path.cwd()}: not a git checkout (name the repository with --repo)")
    progress = None if args.no_progress else (lambda line: print(line, file=sys.stderr, flush=True))
    # Its worktrees, builds and rounds end with it on Ctrl-C; the counts and steps made are in the state file.
    with lifecycle.guard("relu2 bisect", lambda: "the counts and steps measured so far are kept in its state file: the same "
                                                 "command resumes"):
        report = bisect.run(repo, args.good, args.bad, targets, factor=args.factor, budget=args.budget,
                            state=Path(args.state) if args.state else None,
                            device=machine.resolve_device(args.device), progress=progress)
    if args.format == "json":
        print(json.dumps(report.as_json(), indent=2, allow_nan=False))
    else:
        print(bisect.format_text(report))
    return report.exit_code


def cmd_noise(args: argparse.Namespace) -> int:
    if args.action == "check":
        if not args.results and not args.same_box:
            return _fail("noise", "check needs RESULTS_DIR... (cross-box) or --same-box COMPARE_DIR...")
        print(learn.format_check(learn.noise_check(args.results, args.exclude_box, same_box=args.same_box)))
        return 0
    if not args.out:
        return _fail("noise", "learn needs --out FILE (the shipped model, relu2/noise_model.json, is written only "
                              "when named)")
    if not args.results and not args.same_box:
        return _fail("noise", "learn needs RESULTS_DIR... (cross-box) or --same-box COMPARE_DIR...")
    if args.results and args.same_box:
        return _fail("noise", "one kind of model at a time: RESULTS_DIR... (cross-box) or --same-box (same-box)")
    if args.changed_work_only and not args.same_box:
        return _fail("noise", "--changed-work-only is for a same-box model (--same-box COMPARE_DIR...)")

    outputs.claim_file(args.out, force=args.force, own=noise.holds_models)
    command = " ".join(["relu2 noise learn", *args.results, *(f"--same-box {d}" for d in args.same_box),
                        *(f"--exclude-box {b}" for b in args.exclude_box),
                        *(["--changed-work-only"] if args.changed_work_only else []), f"--out {args.out}"])
    boxes = learn.resolve_boxes(args.results, args.exclude_box) if args.exclude_box else []
    model = learn.noise_learn(args.results, args.out, same_box=args.same_box, exclude_boxes=boxes, command=command,
                              changed_work_only=args.changed_work_only)
    for f in model.fits:
        print(f"{f.family:<14} {f.mode:<6} {f.band:<8} {f.cells:>5} cases from {f.pairs:>2} pairs; ratio at 1000 "
              f"gated cells {model.ratio(f.key, 1000):.3f}x")
    print(f"wrote the model {model.name} to {args.out}", file=sys.stderr)
    return 0


def cmd_asv(args: argparse.Namespace) -> int:
    argv = list(args.asv_args)
    if argv[:1] == ["--"]:  # `relu2 asv -- --version`: options asv takes before its command
        argv = argv[1:]
    with lifecycle.guard("relu2 asv"):  # asv's processes, in groups of their own, end with it
        return asv_run.main(argv)


def cmd_inspect(args: argparse.Namespace) -> int:
    from relu2.measure import registry

    if args.impl not in registry.names():
        return _fail("inspect", f"unknown implementation {args.impl!r}; known: {', '.join(registry.names())}")
    device = machine.resolve_device(args.device)

    cell = schema.Cell(args.impl, args.dtype, math.prod(args.shape), tuple(args.shape))
    check_fits([cell], device)
    explained = explain(args.impl, args.dtype, args.shape, device)
    print(format_explanation(explained, show_source=not args.no_source))
    print(counted_work(cell, device))
    if not explained.agrees:  # a finding, as relu2 check's
        print(f"relu2 inspect: {cell.describe()} disagrees with eager (agreement, above)", file=sys.stderr)
        return 1
    return 0


def cmd_counters(args: argparse.Namespace) -> int:
    device = machine.resolve_device(args.device)
    why = counters.unavailable(device)
    if why:
        return _fail("counters", why)
    out = outputs.claim_dir(args.out)
    names = sweep_job.implementations(args.impl, sweep.registered_names(), None if args.impl else sweep.default_names())
    cells = sweep_job.plan_cells(names, args.dtype, args.sizes or schema.default_sizes(device), grid=True,
                                 model_shapes=False, vllm_shapes=False, nemotron=False)
    print(f"relu2 counters: {len(cells)} cells, {args.launches} launch(es) each, under ncu ...", file=sys.stderr)
    counted = counters.count(cells, launches=args.launches)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # whole or absent, the raw output first: a folder with counters.json is one its readers can trust
        atomic_write_text(out / "ncu.csv", counted.raw_csv)
        atomic_write_text(out / "counters.json", json.dumps(work.report_json(counted), indent=1))
    except OSError as e:
        raise WriteError(f"cannot write {out}: {e.strerror}") from None
    print(counters.format_table(counted))
    print(f"counted {len(counted.works)} cells in {counted.seconds:.0f} s; {len(counted.failed)} not counted; "
          f"written to {out}")
    return 1 if counted.failed else 0


def cmd_build(args: argparse.Namespace) -> int:
    from relu2.measure import registry

    jobs = os.environ.get("MAX_JOBS")
    if jobs is not None and not (jobs.strip().isdigit() and int(jobs) > 0):
        return _fail("build", f"MAX_JOBS={jobs!r}: the compiler's parallel jobs, a positive whole number")
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        print("relu2 build: warning: TORCH_EXTENSIONS_DIR is not read; the fused kernel builds into "
              "$RELU2_CACHE_DIR (default ~/.cache/relu2)", file=sys.stderr)

    broken = False
    for name in registry.names():  # resolving an implementation builds what it needs (interface 1)
        start = time.perf_counter()
        impl = registry.get(name)
        seconds = time.perf_counter() - start
        broken |= impl.broken
        state = ("BROKEN: " if impl.broken else "unavailable: ") + impl.reason.splitlines()[0] if not impl.available \
            else f"ready in {seconds:.1f} s ({', '.join(impl.devices)})"
        print(f"  {name:<22}{state}")
    return 1 if broken else 0


def _gate_floor() -> str:
    return f"{schema.DEFAULT_FLOOR_S * 1e6:g} µs"


def _gate_description() -> str:
    """--help of the gate: constants only (help text never reads or simulates the model)."""
    noise = schema
    return ("Judge HEAD against BASE: two commits in a results folder (cross-box: the median of each cell's "
            "rounds), or a compare folder (--compare DIR: base and head measured side by side on one box by "
            "relu2 compare; round i of head against base rounds i-1..i+1). One rule for both: a cell is slower "
            "when it moved beyond its threshold, times its spread between processes (cross-box), after the move of "
            "the references (eager, copy) in its mode and band as far as a box moves (a larger common move is "
            "reported and left in), AND beyond an absolute floor (" + _gate_floor() + "). Thresholds come from the "
            "noise model of this GPU model and kind (relu2/noise_model.json; relu2 noise learn), per "
            "implementation family, timing mode and band of bytes against the L2 (" + ", ".join(noise.BAND_NAMES)
            + f"), sized so that at most {noise.BUDGET:.0%} of runs of unchanged code fail. A GPU with no model of "
            "its own is refused, or judged by --factor only. Every report ends with its resolution: the slowdown "
            "caught in 90% of no-change cases of boxes the model did not learn from. launch is reported "
            "(--gate-launch gates it); on a CPU machine timings are reported, not gated (--factor gates them). "
            "Fails: a regression, a new failure, a vanished cell, a cell the head measured that has no base figure "
            "(--allow-missing names those allowed). Repicked (same code, another autotuned pick) is reported, only "
            "for the compiled paths and within a bound. --confirmed FILE (relu2 confirm) fails only on cells "
            "flagged again. Refused (exit 2) unless a flag says you mean it: two GPU models, two versions of a "
            "benchmark, a base whose cells mostly failed, an incomplete compare. Exit 1 on any finding, 0 on none, "
            "2 on unusable input.")


# --- parser --------------------------------------------------------------------------------------

_DEVICE_HELP = "cpu or cuda (default: cuda when torch sees a GPU, else cpu)"


def bisect_description() -> str:
    return f"""\
Bisect the first-parent commits from GOOD to BAD for the cells named (--cell) or flagged by a gate
report (--from-gate), measuring every step on this machine: the probe commit beside GOOD, then
beside BAD (two relu2 confirm comparisons: relu2 compare's mechanism on those cells, worktrees of
both commits, this checkout's instrument, interleaved rounds of a fresh process a side).

By counters first: on CUDA with Nsight Compute, every cell's work is counted at GOOD and BAD (as
relu2 counters does); a cell whose work differs (its launches or an exact counter) is bisected by
counters alone, one count a commit and no rounds: the first commit whose work is not GOOD's, its
change said. The other cells are timed as below; without counters that is said once.

Step 0 measures GOOD against BAD: a cell that did not move there is "not reproduced". Every later
step gives each cell one of three answers:
  like GOOD   BAD moved away from the probe; the probe did not move away from GOOD
  like BAD    the probe moved away from GOOD the way BAD did; BAD did not move further
  unknown     neither or both: noise, or a probe halfway along a cell that moved twice
"Moved" is the paired rule of relu2 gate --compare (one function): the median over rounds of round
i of one side against rounds i-1..i+1 of the other, beyond the cell's factor and the gate's floor,
after at least {schema.MIN_ROUNDS} rounds. A cell's factor is relu2 compare's: this GPU's
same-box noise model for its family, mode and band (the cells followed sharing its budget), or
{bisect.DEFAULT_FACTOR:g} where the model has none (the CPU's covers only eager and copy); --factor sets one for all.

The budget: a step measures {schema.MIN_ROUNDS} rounds; an unknown answer measures {schema.MIN_ROUNDS} more, until
the answer is known or --budget ROUNDS (default {bisect.DEFAULT_BUDGET}) are spent; a probe still unknown then
is skipped for that cell and said so. Commits that cannot be measured (older than the
implementations interface, a failed build, a failed cell) are skipped like git bisect skip, and
the answer is then the range the first commit like BAD lies in. Each cell is searched on its own:
cells that moved at different commits get different answers.

It names, per cell, the first commit like BAD with its figures and its parent's (by counters: its
change of work), and the steps taken. Progress on stderr (step, commit, answers, rounds, time); the
counts and the steps are written to the state file as they are made, and the same command run again resumes (a finished bisection prints its answer
again without measuring). Exit 0 when a culprit (or a range of unmeasurable commits) is named, 1
when no cell's step is reproduced between GOOD and BAD, 2 on unusable input."""


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "cuda"), help=_DEVICE_HELP)


_REQUIRE_IDLE_HELP = ("refuse to start (exit 2, nothing written) when the machine is not quiet: another compute "
                      "process on the GPU (nvidia-smi), or other processes using the CPU (default: say so and measure)")


def _add_require_idle(p: argparse.ArgumentParser) -> None:
    p.add_argument("--require-idle", action="store_true", help=_REQUIRE_IDLE_HELP)

def _add_force(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--force", action="store_true", help=f"write over {what} that exists (even one the repository "
                   "tracks); without it an existing one is refused (exit 2, nothing written)")


def _machine_name(text: str) -> str:
    try:
        return name_part(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--machine ")) from None


def build_parser() -> argparse.ArgumentParser:
    modes = ", ".join(f"{m.name} ({m.doc})" for m in schema.MODES)
    parser = argparse.ArgumentParser(
        prog="relu2",
        description="Benchmark and regression-track relu²(x) = relu(x)²: a fused kernel against eager "
        "and torch.compile, agreement checked bitwise before every timing. Exit codes: 0 ok, 1 a finding "
        "(disagreement, failed cell, regression), 2 unusable input, 130 interrupted.",
    )

    parser.add_argument("--version", action="version", version=f"relu2 {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="device, versions, cache size, copy bandwidth, implementations",
                       description="Show the device, library versions, L2 (or CPU last-level cache) size, the "
                       "copy bandwidth the roofline uses, and which implementations are available here and why not.")
    _add_device(p)
    p.add_argument("--no-bandwidth", action="store_true", help="skip the copy-bandwidth measurement")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("check", help="the bitwise agreement matrix; exit 1 on any disagreement",
                       description="Run every implementation on the full input matrix (random normals mixed with "
                       "NaN, ±inf, ±0, subnormals, overflowing squares; odd sizes; sliced, transposed and offset "
                       "views) and compare with torch.square(F.relu(x)) bit for bit. Exit 1 on any disagreement "
                       "or when the project's own kernel cannot build; 2 when an implementation named with --impl "
                       "cannot run here. An implementation's declared exceptions are shown beside its verdicts: "
                       "'NaN -> +0' is held to +0 exactly where the input is NaN and bitwise elsewhere; 'writes "
                       "its input' is given a clone of each input.")
    p.add_argument("--impl", type=_csv_list(), help="comma-separated implementations (default: all relu² ones)")
    p.add_argument("--dtype", type=_csv_list(schema.DTYPES), default=list(schema.DTYPES), help="default: all three")
    _add_device(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("sweep", help="agreement then timing over a grid of sizes; CSV, table and plots",
                       description="For every implementation x dtype x size: check agreement on a fresh input, "
                       f"then time it in each mode: {modes}. Writes DIR/sweep.csv (the columns of `relu2 export`) "
                       "and plots, prints a table (! marks implausible figures). Runs on the CPU when there is no "
                       "GPU. Each implementation runs in a worker process of its own: one that crashes or hangs fails "
                       "its own cells, with the reason, and the others are measured. Exit 1 if any cell failed, 2 "
                       "on unusable input or when an implementation named with --impl cannot run here. "
                       "Interrupted, it keeps what it measured in DIR/sweep.partial.csv; the same command again "
                       "resumes.")
    _add_device(p)
    p.add_argument("--impl", type=_csv_list(), help="comma-separated implementations (default: all but those "
                   "that declare themselves variants, left out of a default sweep; copy always)")
    p.add_argument("--dtype", type=_csv_list(schema.DTYPES), default=list(schema.DTYPES), help="default: all three")
    p.add_argument("--sizes", type=_sizes, help=f"comma-separated numels, each {SIZE_FORMS} "
                   "(default: 2^10..2^28 every factor 4 on CUDA, up to 2^22 on the CPU)")
    p.add_argument("--modes", type=_csv_list(schema.MODE_NAMES), default=list(schema.MODE_NAMES),
                   help=f"comma-separated timing modes (default: {','.join(schema.MODE_NAMES)})")
    p.add_argument("--model-shapes", action="store_true", help="also time (tokens x hidden) bf16 model shapes")
    p.add_argument("--vllm-shapes", action="store_true",
                   help="also time vLLM's own relu² benchmark grid (batch x seq x d, as tokens x hidden) in --dtype")
    p.add_argument("--nemotron", action="store_true",
                   help="also time the Nemotron relu² widths at decode and prefill token counts (bf16)")
    p.add_argument("--no-grid", action="store_true", help="only the shapes asked for with the options above")
    p.add_argument("--samples", type=_positive(int, 10_000), default=10,
                   help="samples per figure, at most 10000 (default: 10)")
    p.add_argument("--sample-ms", type=_positive(float, 10_000), default=5.0,
                   help="milliseconds of calls per sample, at most 10000 (default: 5)")
    p.add_argument("--timeout", type=_positive(float, 86_400), default=None, metavar="SECONDS",
                   help="an implementation that gives no answer for one input in this long is killed and its "
                   "remaining cells fail (default: 300)")
    p.add_argument("--in-process", action="store_true",
                   help="measure every implementation in this process, not a worker process each (for a "
                   "debugger; a crashing kernel then ends the run, and compiler caches are not private)")
    p.add_argument("--machine", default=None,
                   help="machine name recorded in the CSV (default: the GPU's name on CUDA, else the hostname)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_require_idle(p)
    p.add_argument("--out", type=_out_dir, required=True, help="a new output folder, or one this command left "
                   "unfinished (it resumes); locked while the sweep runs")
    _add_force(p, "a folder")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plot", help="latency, bandwidth, speed-up, memory and history plots",
                       description="Plot latency vs size (with the memory floor), achieved GB/s (with the copy "
                       "ceiling), speed-up over eager, GPU memory at the peak of a call, and the history of cells "
                       "across commits, as PNG and SVG, from an asv results directory or a sweep.csv.")
    p.add_argument("source", help="asv results directory (e.g. results/) or a sweep.csv")
    p.add_argument("--out", type=_out_dir, required=True, help="a new output folder")
    _add_force(p, "a folder")
    p.add_argument("--commit", type=_nonempty("--commit"),
                   help="commit to plot: a hash, a prefix or a git ref (main~1); default: the latest")
    p.add_argument("--machine", help="machine to plot; default: the latest commit's")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("export", help="asv results to a tidy CSV",
                       description="Write the asv results under RESULTS_DIR as a tidy CSV to --out, or to stdout. "
                       "Columns: " + "; ".join(f"{c.name} ({c.doc})" for c in schema.COLUMNS) + ".")
    p.add_argument("results", metavar="RESULTS_DIR")
    p.add_argument("--out", type=_out_file, help="a new CSV file to write (default: stdout)")
    _add_force(p, "a file")
    p.add_argument("--machine", type=_nonempty("--machine"), help="only this machine")
    p.add_argument("--commit", type=_nonempty("--commit"),
                   help="only this commit: a hash, a prefix or a git ref (main~1, a tag)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("publish", help="the dashboard: asv publish, asv-tachyon's offline UI, keyed by machine",
                       description="Run `asv publish` (options after --, e.g. -- --no-pull) and `asv-tachyon "
                       "install` over its html folder, then reshape what they published: series keyed by machine "
                       "(GPU machines first, so the dashboard opens on the GPU history and a chosen machine shows "
                       "its figures), no kernel fingerprints drawn, and only what `relu2 gate` gates on the "
                       "Regressions page (no CPU machine's timings, no launch mode). The results are not touched.")
    p.add_argument("--config", default="asv.conf.json", help="asv's configuration (default: asv.conf.json)")
    p.add_argument("asv_args", nargs=argparse.REMAINDER, metavar="-- ASV_OPTIONS", help="passed to asv publish")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("gate", help="fail (exit 1) when HEAD is slower than BASE beyond noise, or lost a cell",
                       description=_gate_description())
    p.add_argument("base", metavar="BASE", nargs="?", help="base commit: a hash, a prefix or a git ref (main~1, a tag)")
    p.add_argument("head", metavar="HEAD", nargs="?", help="head commit: a hash, a prefix or a git ref (HEAD, a branch)")
    p.add_argument("--results", default=None, help="asv results directory (default: results)")
    p.add_argument("--compare", metavar="DIR", default=None,
                   help="a compare folder (relu2 compare --out DIR) instead of BASE HEAD: the paired verdict")
    p.add_argument("--machine", help="the machine of both sides: its folder's name or the name in its machine.json "
                   "(default: the only one)")
    p.add_argument("--base-machine", help="BASE's machine, e.g. the first of two sessions")
    p.add_argument("--head-machine", help="HEAD's machine, e.g. the second session")
    p.add_argument("--factor", type=_number(float, 1.0, strict=False), default=None,
                   help="one slow-down ratio for every gated cell, instead of the noise model's per mode and band")
    p.add_argument("--floor-us", type=_number(float, 0.0, strict=False), default=None,
                   help="one absolute floor in µs for every gated cell (default: the noise model's, "
                   f"{_gate_floor()})")
    p.add_argument("--gate-launch", type=_number(float, 1.0, strict=False), default=None, metavar="RATIO",
                   help="gate the launch mode too, at this ratio (default: reported, not gated)")
    p.add_argument("--allow-missing", action="append", default=[], metavar="PATTERN",
                   help="cells allowed to vanish at HEAD, or to be measured there without a base figure (unjudged): "
                   "an fnmatch pattern of the cell's label, e.g. "
                   "'ModelShapes.*' or '*impl=triton*' (repeatable)")
    p.add_argument("--confirmed", metavar="FILE", default=None,
                   help="a re-measurement of the flagged cells (JSON: base, head, cells with base_rounds and "
                   "head_rounds; docs/methodology.md): fail only on cells that flag again")
    p.add_argument("--across-gpus", action="store_true",
                   help="compare although BASE and HEAD were measured on different GPU models")
    p.add_argument("--across-versions", action="store_true",
                   help="compare although a benchmark's version (its timing method) differs between BASE and HEAD")
    p.add_argument("--allow-failed-base", action="store_true",
                   help="compare although most of BASE's cells failed (its failed cells are reported, not compared)")
    p.add_argument("--noise-model", metavar="FILE", default=None,
                   help="a noise model from relu2 noise learn (default: the one shipped, relu2/noise_model.json)")
    p.add_argument("--expect-gpu", metavar="NAME", default=None,
                   help="with --compare: refuse (exit 2) unless both sides and compare.json name this GPU (as torch "
                   "reports it, e.g. 'NVIDIA H200'; never none)")
    p.add_argument("--plan", metavar="SUITES_DIR", default=None,
                   help="with --compare: the trusted suites (a benchmarks/ folder): refuse a compare of fewer suites "
                   "or a narrowed one, and fail on every planned cell absent from either side (missing)")
    p.add_argument("--spread", action="store_true",
                   help="also print head/base per implementation and mode (median, p10, p90, max): run on one "
                   "commit measured on two boxes, it is the A/A data a noise model is learned from")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="text (default), markdown (for a pull-request comment) or json (stable keys, "
                   "docs/tracking.md)")
    p.set_defaults(func=cmd_gate)


    p = sub.add_parser("compare", help="measure BASE and HEAD on this machine in interleaved rounds, then judge "
                       "the paired figures", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=COMPARE_DOC)
    p.add_argument("base", metavar="BASE", help="base commit (a git ref of --repo)")
    p.add_argument("head", metavar="HEAD", help="head commit (a git ref of --repo; BASE itself makes an A/A)")
    p.add_argument("--suites", type=_names, default=[], metavar="A,B",
                   help="only these suites of benchmarks/bench_relu2.py (default: all), e.g. Grid")
    p.add_argument("--rounds", type=_number(int, 1, strict=False, maximum=schema.MAX_ROUNDS), default=schema.MIN_ROUNDS,
                   help=f"rounds a side, 1 to {schema.MAX_ROUNDS} (default {schema.MIN_ROUNDS}; fewer than {schema.MIN_ROUNDS} "
                        "leave the paired rule too few pairs)")
    p.add_argument("--repo", metavar="DIR", help="the git checkout holding both commits (default: the one here)")
    p.add_argument("--machine", type=_machine_name,
                   help="the machine name to record (default: asv's name for this host)")
    p.add_argument("--out", type=_out_dir, metavar="DIR",
                   help="a new or empty folder for the layout (default: .asv/compare/BASE8-HEAD8-TIME)")
    p.add_argument("--resume", action="store_true",
                   help="continue the incomplete compare in --out DIR (a run that died or was stopped): its rounds "
                        "are kept, the rest measured on this box, then written and judged; refused if DIR was "
                        "measured with other commits, rounds, cells, instrument or on another boot of the box")
    p.add_argument("--measure-only", action="store_true",
                   help="measure and write DIR, judge nothing (CI's measuring job; relu2 gate --compare DIR judges)")
    p.add_argument("--factor", type=_number(float, 1.0, strict=False), default=None,
                   help="judge with this ratio instead of the same-box noise model")
    p.add_argument("--noise-model", metavar="FILE", default=None, help="a same-box noise model (relu2 noise learn "
                   "--same-box; default: the one shipped for this machine's GPU model)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="the verdict's format on stdout (all three are written to DIR/report.*)")
    _add_device(p)
    _add_require_idle(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("confirm", help="measure flagged cells again, base and head: relu2 compare's rounds on them",
                       description="Before a regression fails a pull request, measure the cells the gate flagged "
                       "again on this box with relu2 compare's mechanism (git worktrees of both commits, this "
                       "checkout's instrument, ABBA rounds, a fresh process per side and round), on those cells "
                       "only and with more rounds. Writes each side's median per round (--out) for relu2 gate "
                       "--confirmed. A flagged summary (Implementations.track_*, a mean over Grid cells) is not one "
                       "cell: it is named on stderr, not re-measured, and the gate still fails on it. Before any "
                       "round it refuses a cell a side cannot measure here (an implementation it does not have, one "
                       "that cannot run on this device, a dtype not timed), a report that flags no cell, and an "
                       "--out it could not write. Exit 0 when every flagged figure was re-measured, 1 when one "
                       "could not be, 2 on unusable input (one line, nothing measured).")
    p.add_argument("base", metavar="BASE", help="base commit (any git ref of this checkout)")
    p.add_argument("head", metavar="HEAD", help="head commit (any git ref of this checkout)")
    p.add_argument("--from-gate", metavar="GATE_JSON", help="the regressions of relu2 gate --format json")
    p.add_argument("--cell", action="append", default=[], type=_target, metavar="IMPL:DTYPE:SHAPE:MODE",
                   help="a figure to confirm, e.g. fused:bfloat16:4096x4096:hot (repeatable)")

    p.add_argument("--rounds", type=_number(int, schema.MIN_ROUNDS, strict=False, maximum=2 * schema.MAX_ROUNDS),
                   default=schema.CONFIRM_ROUNDS,
                   help=f"fresh processes per side, {schema.MIN_ROUNDS} to {2 * schema.MAX_ROUNDS}: fewer cannot tell a step from the "
                        f"spread between rounds (default {schema.CONFIRM_ROUNDS}: twice a compare's)")
    p.add_argument("--out", type=_out_file, help="write the rounds as JSON here (a new file)")
    _add_force(p, "a file")
    p.add_argument("--repo", metavar="DIR", help="the git checkout holding both commits (default: the one here)")
    p.add_argument("--machine", type=_machine_name, help="the machine name to record (default: this host's name)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    _add_require_idle(p)
    _add_device(p)
    p.set_defaults(func=cmd_confirm)

    p = sub.add_parser("bisect", help="find the commit between GOOD and BAD where cells moved, measuring each step",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=bisect_description())
    p.add_argument("good", metavar="GOOD", help="a commit whose figures are the old ones (any git ref)")
    p.add_argument("bad", metavar="BAD", help="a later commit whose figures moved (any git ref); GOOD must be its ancestor")
    p.add_argument("--cell", action="append", default=[], type=_target, metavar="IMPL:DTYPE:SHAPE:MODE",
                   help="a figure to follow, e.g. fused:bfloat16:4096x4096:hot (repeatable)")
    p.add_argument("--from-gate", metavar="FILE",
                   help="follow the regressions of relu2 gate --format json (or a relu2 compare folder's report.json)")
    p.add_argument("--repo", metavar="DIR", help="the git repository whose commits are bisected (default: this checkout)")
    p.add_argument("--state", metavar="FILE", help="where the steps are kept, for resuming (default: in the "
                   "repository's git folder, named by the range and the cells)")
    p.add_argument("--budget", type=_number(int, schema.MIN_ROUNDS, strict=False, maximum=2 * schema.MAX_ROUNDS),
                   default=bisect.DEFAULT_BUDGET,
                   metavar="ROUNDS", help=f"the most rounds one step measures, {schema.MIN_ROUNDS} to {2 * schema.MAX_ROUNDS} "
                   f"(default {bisect.DEFAULT_BUDGET})")
    p.add_argument("--factor", type=_number(float, 1.0), default=None,
                   help=f"one factor for every cell: a median per-round ratio beyond it is a move (default: "
                   f"each cell's from this GPU's same-box noise model, else {bisect.DEFAULT_FACTOR:g})")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json (for CI)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    _add_device(p)
    p.set_defaults(func=cmd_bisect)

    p = sub.add_parser("noise", help="learn the gate's noise model from recorded runs, or check it out of sample",
                       description="relu2 noise learn RESULTS_DIR... --out FILE: from every pair of runs of two "
                       "boxes in one folder (one GPU model), the cells whose kernel did not change, learn per "
                       "implementation family, timing mode and band how far they move (the cross-box model); "
                       "relu2 noise learn --same-box COMPARE_DIR... --out FILE: the same from A/A compare folders "
                       "(the same-box model). relu2 noise check RESULTS_DIR... (or --same-box COMPARE_DIR...): the "
                       "same, each box left out in turn, as a table (docs/methodology.md); a same-box check counts "
                       "each compare folder as its own no-change comparison.")
    p.add_argument("action", choices=("learn", "check"),
                   help="learn: write the model; check: leave each box out in turn (or each --exclude-box), learn "
                   "without it, and print per family, mode and band the false flags and the share of planted "
                   "slowdowns caught on the pairs that include it (out of sample)")
    p.add_argument("results", nargs="*", metavar="RESULTS_DIR")
    p.add_argument("--same-box", action="append", default=[], metavar="COMPARE_DIR",
                   help="learn (or check) the same-box model from these compare folders (A/A: cells whose kernel "
                   "is the same on both sides, so a planted compare's other implementations count too)")
    p.add_argument("--changed-work-only", action="store_true",
                   help="with --same-box: the model judges only the cells whose exact work changed (the other cells "
                   "keep the GPU's cross-box model): for a GPU whose same-box model failed more no-change "
                   "comparisons out of sample than the budget allows (docs/methodology.md)")
    p.add_argument("--out", type=_out_file, default=None, help="where to write the model (required for learn; a "
                   "file that holds models of other GPUs or kinds keeps them; a file the repository ships, such as "
                   "relu2/noise_model.json, needs --force)")
    _add_force(p, "a model file the repository ships, or a file that holds no model,")
    p.add_argument("--exclude-box", action="append", default=[], metavar="FOLDER:MACHINE",
                   help="a box (results folder and machine; a machine name only when one box has it): learn leaves "
                   "it out, check leaves only these out in turn")
    p.set_defaults(func=cmd_noise)

    p = sub.add_parser("asv", help="run asv with atomic result writes; e.g. relu2 asv run --skip-existing-commits A..B",
                       description="Run asv (same commands and options) with its JSON files written atomically: "
                       "to a temporary file in the same folder, then renamed over the old one, so a run killed "
                       "mid-write leaves the previous file or none, never half a file. asv saves a commit's results "
                       "once all its benchmarks have run; to resume an interrupted `relu2 asv run A..B`, run "
                       "`relu2 asv run --skip-existing-commits A..B`: the commits already saved are skipped and the "
                       "one that was interrupted is measured again. Options asv takes before its command (-v, "
                       "--config) go after it (relu2 asv run -v ...), or after -- (relu2 asv -- --version). Before "
                       "`run` it says whether the machine is quiet and records it in the machine's metadata (keys "
                       "quiet, busy); `relu2 asv run --require-idle ...` refuses to start on a busy one. Ctrl-C or "
                       "SIGTERM ends every process the run started, asv's own included, and exits 130.")
    p.add_argument("asv_args", nargs=argparse.REMAINDER, metavar="ASV_ARGS", help="asv's command and options")
    p.set_defaults(func=cmd_asv)

    p = sub.add_parser("inspect", help="what actually ran for one cell: generated code, launch config, load widths, work counters",
                       description="Run IMPL once on a fresh input of --shape and --dtype, after the warm-up a "
                       "measurement gives it, and show what ran: the fingerprint results record, the kernels one "
                       "call launches (CUDA), the code inductor generated for the graph dynamo picks (Triton on "
                       "CUDA, C++ on the CPU) with its launch configuration, and the width of every global load "
                       "and store, read from the PTX (Triton) or the SASS (the fused extension, via cuobjdump); "
                       "then the work one call did, as Nsight Compute counts it in a child under ncu (each "
                       "kernel's launch and exact counters), or why it is not counted here.")
    p.add_argument("impl", metavar="IMPL", help="an implementation (relu2 info lists them)")
    p.add_argument("--shape", type=_shape, required=True, help="the input's shape, e.g. 19418x13824 or 4096")
    p.add_argument("--dtype", choices=schema.DTYPES, default="bfloat16", help="default: bfloat16")
    _add_device(p)
    p.add_argument("--no-source", action="store_true", help="leave the generated source out")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("counters", help="work counters of every cell, read by Nsight Compute (CUDA)",
                       description="Count what each cell's kernels do, under Nsight Compute (ncu): each kernel's "
                       "name, grid, block and registers, its executed instructions, global load and store "
                       "instructions and bytes, and DRAM bytes, from untimed launches after the warm-up a timing "
                       "gets. Writes DIR/counters.json and ncu's own CSV (DIR/ncu.csv). Exit 1 when a cell could "
                       "not be counted, 2 without CUDA or ncu.")
    _add_device(p)
    p.add_argument("--impl", type=_csv_list(), help="comma-separated implementations (default: as relu2 sweep)")
    p.add_argument("--dtype", type=_csv_list(schema.DTYPES), default=list(schema.DTYPES), help="default: all three")
    p.add_argument("--sizes", type=_sizes, help=f"comma-separated numels, each {SIZE_FORMS} (default: the grid's)")
    p.add_argument("--launches", type=_number(int, 1, strict=False, maximum=100), default=1,
                   help="profiled launches of each cell, 1 to 100 (default 1; more show they count alike)")
    p.add_argument("--out", type=_out_dir, required=True, help="a new output folder")
    p.set_defaults(func=cmd_counters)

    p = sub.add_parser("build", help="build every implementation's kernels ahead of time",
                       description="Resolve every registered implementation, which builds what it needs (the "
                       "fused kernel: JIT-built into a cache keyed by the hash of its sources and flags, so later "
                       "processes load it in about a second), and say how long each took or why it cannot run. "
                       "Exit 1 when one of the measured package's own kernels did not build.")
    p.set_defaults(func=cmd_build)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)

    def one_line(message, category, filename, lineno, file=None, line=None) -> None:
        # A warning is for the user, not a pointer into relu2's source: one line naming the command.
        print(f"relu2 {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings(), lifecycle.interrupts():
            warnings.showwarning = one_line
            return args.func(args)
    except KeyboardInterrupt as e:
        if not getattr(e, "reported", False):  # relu2.host.lifecycle.guard has said what it stopped
            print("\ninterrupted", file=sys.stderr)
        return 130
    except ProcessFailed as e:  # a child ended without its work (the guard added what is kept): not bad input
        print(f"relu2 {args.command}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader left (`relu2 gate | head`): no traceback, and not 0, since not all was written.
        # stdout goes to devnull so that the interpreter's own flush at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as e:  # noqa: BLE001  unusable input: one line, no traceback (see _is_usage_error)
        if not _is_usage_error(e):
            raise
        return _fail(args.command, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)


def _is_usage_error(e: BaseException) -> bool:
    """Input refused at the boundary: exit 2, one line.  Only the refusals the code raises for bad input
    count (``relu2.vocab.errors.Refused``: a device or size that is not here, a malformed or unwritable
    file, an unknown commit); any other error is a bug, and its traceback is what a user must report."""
    return isinstance(e, (Refused, argparse.ArgumentError))


if __name__ == "__main__":
    raise SystemExit(main())
