"""The dashboard, offline: ``asv publish`` + ``asv-tachyon install`` over the fixture, loaded in headless Chromium.

How the browser is driven: the plain Chromium command line, one process per page, with
``--virtual-time-budget`` (the page's scripts run to quiescence), ``--dump-dom`` (the rendered DOM
on stdout), ``--screenshot`` and ``--enable-logging=stderr`` (console messages and uncaught
exceptions appear on stderr as ``CONSOLE`` lines).  No Playwright, Selenium or DevTools client:
nothing to download or install beyond the Debian ``chromium`` package, and nothing that can drift
from the browser's version.  ``--host-resolver-rules`` makes every host but 127.0.0.1 unresolvable,
so the test proves the page needs no network even on a machine that has one; the legacy asv page
(CDN scripts) is the negative control.

The HTML is served by ``http.server`` on 127.0.0.1 with an ephemeral port, in a thread, and every
request is recorded.  Skipped when Chromium is not installed (``.ci/run`` installs it).

Set ``RELU2_UPDATE_DOCS_SCREENSHOT=1`` to also copy the regressions page screenshot to
docs/img/dashboard.png.
"""

from __future__ import annotations

import contextlib
import functools
import html as html_lib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLANTED_NAME = "bench_relu2.Grid.track_hot('fused', 'bfloat16', 16777216)"
# Cell indices of Grid.track_hot in asv's params order (impl x dtype x numel): fused, triton and
# copy at bfloat16 2^24.  tachyon selects series by these in its URL.
EXPLORE_PARAMS = "38,48,58"
BENCHMARKS = [
    "bench_relu2.Grid.track_cold", "bench_relu2.Grid.track_hot", "bench_relu2.Grid.track_launch",
    "bench_relu2.ModelShapes.track_cold", "bench_relu2.ModelShapes.track_hot",
    "bench_relu2.ModelShapes.track_launch", "bench_relu2.ModelShapes.track_peak_memory",
]

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)"),
    pytest.mark.skipif(importlib.util.find_spec("asv_tachyon") is None,
                       reason="asv-tachyon not installed (it is a dependency: pip install -e .)"),
    pytest.mark.skipif(shutil.which("git") is None, reason="asv publish needs git"),
]


# ---------------------------------------------------------------------------------------------
# building and serving the site


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The published and tachyon-installed HTML folder, built from a copy of the fixture."""
    return _build_site(tmp_path_factory.mktemp("dashboard"))


def _build_site(root: Path, edit=None, relu2_publish: bool = False, older_commits: int = 0) -> Path:
    """Publish a copy of the fixture (after ``edit(results)``) and install tachyon over it: with asv's
    and tachyon's own commands, or with ``relu2 publish`` (both, then the reshaping).  ``older_commits``
    commits dated before the fixture's, on a branch of their own, shift the fixture's revisions (asv
    numbers every commit of the repository by date)."""
    home = root / "home"
    home.mkdir()
    # A private HOME: asv reads ~/.asv-machine.json and git reads ~/.gitconfig; neither may leak in.
    env = {**os.environ, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}
    repo = root / "repo"
    _run(["git", "clone", "-q", "--branch", "main", str(fx.BUNDLE), str(repo)], env, root)
    if older_commits:
        _run(["git", "checkout", "-q", "--orphan", "older"], env, repo)
        for day in range(1, older_commits + 1):
            dated = {**env, "GIT_AUTHOR_DATE": f"2026-10-{day:02d}T12:00:00Z", "GIT_COMMITTER_DATE":
                     f"2026-10-{day:02d}T12:00:00Z", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                     "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
            _run(["git", "commit", "-q", "--allow-empty", "-m", f"older {day}"], dated, repo)
        _run(["git", "checkout", "-q", "main"], env, repo)
    results = fx.copy_results(root / "results")
    if edit is not None:
        edit(results)
    html = root / "html"
    conf = root / "asv.conf.json"
    conf.write_text(json.dumps({
        "version": 1,
        "project": "relu2-bench-fixture",
        "project_url": "https://example.invalid/relu2-bench-fixture",
        "repo": str(repo),
        "dvcs": "git",
        "branches": ["main"],
        "environment_type": "virtualenv",
        "benchmark_dir": str(repo / "benchmarks"),
        "results_dir": str(results),
        "html_dir": str(html),
    }))
    if relu2_publish:
        _run([sys.executable, "-m", "relu2", "publish", "--config", str(conf), "--", "--no-pull"], env, root)
        return html
    # The installed asv of this interpreter, and asv-tachyon's own CLI (`asv-tachyon install HTML_DIR`).
    _run([sys.executable, "-m", "asv", "publish", "--no-pull", "--config", str(conf)], env, root)
    _run([sys.executable, "-m", "asv_tachyon", "install", str(html)], env, root)
    return html


@dataclass
class Server:
    url: str
    requests: list[tuple[str, int]] = field(default_factory=list)  # (path, status), in order

    def status_of(self, path_prefix: str) -> list[int]:
        return [code for path, code in self.requests if path.startswith(path_prefix)]


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[Server]:
    """``site`` served on 127.0.0.1 (never every interface) at an ephemeral port, requests recorded."""
    with _serving(site) as server:
        yield server


@contextlib.contextmanager
def _serve(site: Path) -> Iterator[str]:
    with _serving(site) as server:
        yield server.url


@contextlib.contextmanager
def _serving(site: Path) -> Iterator[Server]:
    server = Server(url="")

    class Handler(SimpleHTTPRequestHandler):
        def log_request(self, code="-", size="-") -> None:
            server.requests.append((self.path, int(code)))

        def log_message(self, format, *args) -> None:  # noqa: A002 - the stdlib's signature
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


# ---------------------------------------------------------------------------------------------
# the browser


@dataclass
class Page:
    dom: str
    text: str  # the DOM's visible text, whitespace collapsed
    console: list[str]  # console messages and uncaught exceptions
    screenshot: Path

    def errors(self) -> list[str]:
        """Console lines that report a failure (plain logging is allowed)."""
        return [m for m in self.console if re.search(r"uncaught|error|exception|failed", m, re.I)]


_CONSOLE = re.compile(r":CONSOLE[^\]]*\]\s*(.*)$")


def page_text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", dom))).strip()


def load(url: str, workdir: Path, name: str, height: int = 1000) -> Page:
    """Render ``url`` in headless Chromium until its scripts settle; DOM, console and a screenshot."""
    profile = workdir / f"profile-{name}"
    shot = workdir / f"{name}.png"
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
        "--enable-logging=stderr", "--v=0",
        # Offline by construction: only the local server resolves.
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--virtual-time-budget=10000", f"--window-size=1400,{height}", f"--screenshot={shot}",
    ]
    env = {**os.environ, "HOME": str(workdir)}
    proc = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True,
                          timeout=180, env=env)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    console = [m.group(1) for line in proc.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return Page(dom=proc.stdout, text=page_text(proc.stdout), console=console, screenshot=shot)


# ---------------------------------------------------------------------------------------------
# tests


def test_publish_keeps_asv_data_and_installs_tachyon(site: Path):
    assert (site / "index.json").is_file() and any((site / "graphs").rglob("*.json"))
    assert (site / "index.legacy.html").is_file()  # asv's own page, kept by tachyon
    regressions = json.loads((site / "regressions.json").read_text())["regressions"]
    # asv's own step detection found the planted step, and nothing else.
    assert [r[0] for r in regressions] == [PLANTED_NAME]


def test_overview_renders_every_benchmark(server: Server, tmp_path: Path):
    page = load(server.url, tmp_path, "overview")
    assert page.errors() == []
    for name in BENCHMARKS:
        assert name in page.text
    assert fx.MACHINE in page.text and "external (JavaScript) dependencies" not in page.text
    assert server.status_of("/index.json") and set(server.status_of("/index.json")) <= {200, 304}


def test_graph_shows_the_commits_of_one_cell(server: Server, tmp_path: Path):
    url = f"{server.url}#view=explore&bench={fx.PLANTED_BENCH}&params={EXPLORE_PARAMS}"
    page = load(url, tmp_path, "explore", height=1500)
    assert page.errors() == []
    assert "<canvas" in page.dom  # the chart (uPlot draws on a canvas)
    # The points of the selected series, newest first: the planted step from 18.6 µs to 28.0 µs.
    points = re.search(r"Recent points (.*?) Source", page.text)
    assert points, page.text[:2000]
    assert re.search(rf"{fx.COMMIT_3[:8]} 27\.9\d+µs {fx.COMMIT_2[:8]} 18\.6\d+µs {fx.COMMIT_1[:8]} 18\.6\d+µs",
                     points.group(1)), points.group(1)
    graph_requests = [(p, c) for p, c in server.requests if p.startswith("/graphs/") and "Grid.track_hot" in p]
    assert graph_requests and all(c in (200, 304) for _, c in graph_requests)
    assert page.screenshot.stat().st_size > 20_000


def test_regressions_page_lists_the_planted_regression(server: Server, tmp_path: Path):
    page = load(f"{server.url}#view=regressions", tmp_path, "regressions", height=520)
    assert page.errors() == []
    assert server.status_of("/regressions.json") and set(server.status_of("/regressions.json")) <= {200, 304}
    row = re.search(re.escape(PLANTED_NAME) + r"(.{0,200})", page.text)
    assert row, page.text[:2000]
    assert "1.50" in row.group(1) and fx.COMMIT_3[:8] in row.group(1)
    assert page.screenshot.stat().st_size > 20_000
    if os.environ.get("RELU2_UPDATE_DOCS_SCREENSHOT") == "1":
        target = ROOT / "docs" / "img" / "dashboard.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page.screenshot, target)


def test_legacy_asv_page_fails_offline(server: Server, tmp_path: Path):
    # Negative control: asv 0.6.6's own page loads jQuery & co. from CDNs, which cannot resolve here.
    # If this ever renders, the offline guarantee of the other tests is not being exercised.
    page = load(f"{server.url}index.legacy.html", tmp_path, "legacy", height=400)
    assert "external (JavaScript) dependencies of airspeed velocity failed to load" in page.text


def _slower_and_lower_is_better(results: Path) -> None:
    """Every Grid.track_hot cell 1.3x slower at commit 3, and the benchmarks marked as our suites mark
    them (``less_is_better`` on each track_ function, copied by asv into benchmarks.json)."""
    benchmarks = json.loads((results / "benchmarks.json").read_text())
    for b in benchmarks.values():
        if isinstance(b, dict) and b.get("unit") == "seconds":
            b["less_is_better"] = True
    (results / "benchmarks.json").write_text(json.dumps(benchmarks))
    path = fx.result_file(results, fx.COMMIT_3)
    data = json.loads(path.read_text())
    row = data["results"]["bench_relu2.Grid.track_hot"]
    column = data["result_columns"].index("result")
    row[column] = [v * 1.3 if v is not None else None for v in row[column]]
    path.write_text(json.dumps(data))


def test_a_slower_seconds_benchmark_is_shown_worse(tmp_path_factory, tmp_path: Path):
    site = _build_site(tmp_path_factory.mktemp("lower-is-better"), _slower_and_lower_is_better)
    index = json.loads((site / "index.json").read_text())
    assert index["benchmarks"]["bench_relu2.Grid.track_hot"]["less_is_better"] is True
    with _serve(site) as url:
        page = load(url, tmp_path, "lower-is-better")
    tile = re.search(r'data-bench="bench_relu2.Grid.track_hot".*?class="foot">(.*?)</div>', page.dom, re.S)
    assert tile, page.text[:1000]
    # tachyon's colour classes: "delta-up" is the bad direction (red), "delta-down" the good one.
    assert 'class="delta-up"' in tile.group(1) and "+" in tile.group(1), tile.group(1)


def test_console_errors_are_seen(site: Path, server: Server, tmp_path: Path):
    # The detector the tests above rely on: an uncaught exception must show up in page.errors().
    (site / "broken.html").write_text("<p>x</p><script>console.log('all-good-marker'); undefinedFunction();</script>")
    page = load(f"{server.url}broken.html", tmp_path, "broken", height=200)
    assert any("undefinedFunction" in e for e in page.errors()), page.console
    assert any("all-good-marker" in m for m in page.console)  # logged, but not an error
    assert not any("all-good-marker" in e for e in page.errors())


# --- issue 19: the dashboard opens on the GPU history, a chosen machine shows its figures ------------

CPU_BOX = "a-cpu-box"  # sorts before fixture-machine: asv lists it first, and tachyon opened on it


def _two_machines_and_fingerprints(results: Path) -> None:
    """A CPU machine beside the fixture's GPU one (other python, gpu none: its own environment), a
    fingerprint benchmark (unit "kernel id") on both, and a launch slowdown on the GPU at commit 3:
    what asv alone would show as the first machine, a chart, and a regression the gate does not gate."""
    benchmarks = json.loads((results / "benchmarks.json").read_text())
    kernel = dict(benchmarks[fx.PLANTED_BENCH], name="bench_relu2.Grid.track_kernel", unit="kernel id")
    benchmarks[kernel["name"]] = kernel
    (results / "benchmarks.json").write_text(json.dumps(benchmarks))
    cpu = results / CPU_BOX
    shutil.copytree(results / fx.MACHINE, cpu)
    info = json.loads((cpu / "machine.json").read_text())
    (cpu / "machine.json").write_text(json.dumps({**info, "machine": CPU_BOX, "gpu": "none", "cpu": "2 cores"}))
    for path in [*cpu.glob("*-*.json"), *(results / fx.MACHINE).glob("*-*.json")]:
        data = json.loads(path.read_text())
        data["results"][kernel["name"]] = data["results"][fx.PLANTED_BENCH]
        if path.parent == cpu:
            data["params"].update(machine=CPU_BOX, gpu="none", cpu="2 cores", python="3.12")
        elif data["commit_hash"] == fx.COMMIT_3:
            row = data["results"]["bench_relu2.Grid.track_launch"]
            column = data["result_columns"].index("result")
            row[column] = [v * 1.5 if v is not None else None for v in row[column]]
        path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, Path]:
    """The same two-machine results, published by asv and tachyon alone and by ``relu2 publish``."""
    root = tmp_path_factory.mktemp("relu2-publish")
    (root / "asv").mkdir()
    (root / "relu2").mkdir()
    return (_build_site(root / "asv", _two_machines_and_fingerprints),
            _build_site(root / "relu2", _two_machines_and_fingerprints, relu2_publish=True))


def _tiles(page: Page) -> dict[str, str]:
    """Overview tile text by benchmark name."""
    return {m.group(1): page_text(m.group(2)) for m in
            re.finditer(r'data-bench="([^"]+)".*?class="foot">(.*?)</div>', page.dom, re.S)}


def test_relu2_publish_opens_on_the_gpu_and_a_chosen_machine_shows_its_figures(published, tmp_path: Path):
    plain, site = published
    plain_regressions = json.loads((plain / "regressions.json").read_text())["regressions"]
    assert {r[2]["machine"] for r in plain_regressions} == {CPU_BOX, fx.MACHINE}  # what asv alone lists
    assert any("track_launch" in r[0] for r in plain_regressions)
    # asv and tachyon alone: the page opens on asv's first environment (os.walk's order), and choosing
    # the other machine keeps the first one's python, cpu and gpu, so no series matches: all "—".
    first = json.loads((plain / "index.json").read_text())["graph_param_list"][0]["machine"]
    other = ({CPU_BOX, fx.MACHINE} - {first}).pop()
    with _serve(plain) as url:
        before = load(f"{url}#machine={other}", tmp_path, "plain-chosen", height=1400)
    assert before.errors() == [] and set(_tiles(before).values()) == {"—"}, _tiles(before)

    with _serve(site) as url:
        opened = load(url, tmp_path, "published", height=1400)
        chosen = load(f"{url}#machine={CPU_BOX}", tmp_path, "published-cpu", height=1400)
        regressions = load(f"{url}#view=regressions", tmp_path, "published-regressions", height=700)
    for page in (opened, chosen, regressions):
        assert page.errors() == []
        assert "kernel id" not in page.text and "track_kernel" not in page.text  # fingerprints are not drawn
    index = json.loads((site / "index.json").read_text())
    assert index["graph_param_list"][0]["machine"] == fx.MACHINE  # the GPU first: the page opens on it
    for page in (opened, chosen):
        tiles = _tiles(page)
        assert tiles and all("—" not in t and re.search(r"\d", t) for t in tiles.values()), tiles
    # Opened on the GPU: its launch tile has commit 3's slowdown, which the CPU copy of the data has not.
    assert "+46" in _tiles(opened)["bench_relu2.Grid.track_launch"]
    assert "+46" not in _tiles(chosen)["bench_relu2.Grid.track_launch"]
    # Regressions: only what the gate gates (a GPU's hot, cold and peak memory), the planted one
    assert [r[0] for r in json.loads((site / "regressions.json").read_text())["regressions"]] == [PLANTED_NAME]
    assert PLANTED_NAME in regressions.text and CPU_BOX not in regressions.text
    assert "track_launch" not in regressions.text
    assert opened.screenshot.stat().st_size > 20_000


# --- issue 31: a history drawn in revision order ---------------------------------------------------


def _launch_slower_at_commit_3(results: Path) -> None:
    path = fx.result_file(results, fx.COMMIT_3)
    data = json.loads(path.read_text())
    row = data["results"]["bench_relu2.Grid.track_launch"]
    column = data["result_columns"].index("result")
    row[column] = [v * 1.5 if v is not None else None for v in row[column]]
    path.write_text(json.dumps(data))


def test_relu2_publish_writes_each_series_in_revision_order_and_the_tile_shows_the_newest(tmp_path_factory,
                                                                                           tmp_path: Path):
    # Nine older commits put the fixture's at revisions 9, 10 and 11: sorted as text, 10 and 11 came
    # before 9, and the dashboard drew commit 1 as the current value (issue 31).
    site = _build_site(tmp_path_factory.mktemp("revision-order"), _launch_slower_at_commit_3, relu2_publish=True,
                       older_commits=9)
    series = [path for path in (site / "graphs").rglob("*.json") if "summary" not in (path.parent.name, path.stem)]
    revisions = {path: [point[0] for point in json.loads(path.read_text())] for path in series}
    assert any(len(set(map(len, map(str, r)))) > 1 for r in revisions.values())  # 9 and 10: the case at hand
    assert all(r == sorted(r) for r in revisions.values()), {p.name: r for p, r in revisions.items() if r != sorted(r)}
    with _serve(site) as url:
        page = load(url, tmp_path, "revision-order", height=1400)
    assert page.errors() == []
    # The newest commit (3) is 1.5x slower in launch: the tile's current value, and its change.
    launch = _tiles(page)["bench_relu2.Grid.track_launch"]
    assert "+4" in launch and "-3" not in launch, launch
