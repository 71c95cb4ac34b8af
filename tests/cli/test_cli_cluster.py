"""The cluster workflow: a runs directory copied from a compute node to a login
node, again and again while the job runs, and synced there.

The producer (``tests/cluster_producer.py``) runs offline, as on a node
without a route to the platform, and reports its own host name: this machine
(the copy is at another path) or another one (a node of its own). The runs
directory is copied with ``shutil.copytree`` over the previous copy, as
rsync or ``cp -a`` would, mid-run and after the job ends or is killed, and
synced with ``sync RUN``, ``sync --all`` or ``sync --watch``.

The oracle, in every case: the platform holds one run; every record the
producer logged is there exactly once in every sink; the run is never closed
while its producer may still write it; it ends as the producer ended it
(crashed only when it was killed and that is known: same host, or
``--job-ended``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
import workloads
from cli_helpers import cli
from sdk_helpers import API_KEY, closed_after_every_record, point_at, wait_for

import primeruns as pr
from primeruns.journal import Journal
from primeruns.spec import SPEC_KEY

TESTS = Path(__file__).resolve().parents[1]
EVAL_EPISODES, TRAIN_STEPS, PER_STEP = 12, 20, 2

KINDS = ("eval", "train")
ENDINGS = ("after", "mid_then_after", "crashed")
HOSTS = ("same", "other")
HOWS = ("run", "all", "watch")

# Every kind, ending, host and command at least once in the default suite;
# the whole product under -m slow.
COVERING = [
    ("eval", "mid_then_after", "other", "all"),
    ("train", "mid_then_after", "same", "run"),
    ("eval", "crashed", "same", "run"),
    ("train", "crashed", "other", "all"),
    ("eval", "after", "same", "watch"),
    ("train", "mid_then_after", "other", "watch"),
]
EVERY = [
    (k, e, h, w)
    for k in KINDS
    for e in ENDINGS
    for h in HOSTS
    for w in HOWS
    if (k, e, h, w) not in COVERING
]


class Producer:
    """The job on the compute node."""

    def __init__(self, node_runs: Path, kind: str, url: str, host: str, *requeue: str) -> None:
        """``requeue``: the run key and the part (``first``, ``second``) of a requeued job."""
        script = str(TESTS / "cluster_producer.py")
        self.proc = procs.start(
            [sys.executable, script, str(node_runs), kind, url, host, *requeue],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ),
            cwd=TESTS,
        )
        first = self._line()
        assert first.startswith("journal "), first
        self.journal = Path(first.split(" ", 1)[1])
        assert self._line() == "half"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def log_the_rest(self) -> None:
        self._send("go")
        assert self._line() == "logged all"

    def finish(self) -> None:
        self._send("finish")
        assert self._line() == "finished"
        assert self.proc.wait(timeout=60) == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # offline: no uplink to kill with it
        self.proc.wait(timeout=30)


def _copy(journal: Path, login_runs: Path) -> Path:
    """Copy the run's directory to the login node, over the previous copy."""
    dest = login_runs / journal.name
    if dest.exists():
        shutil.rmtree(dest)
    login_runs.mkdir(parents=True, exist_ok=True)
    shutil.copytree(journal, dest)
    return dest


class Syncer:
    """``sync RUN``, ``sync --all`` or a ``sync --watch`` left running."""

    def __init__(self, how: str, login_runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.how, self.login_runs, self.capsys = how, login_runs, capsys
        self.watcher: subprocess.Popen[Any] | None = None

    def sync(self, copy: Path, until: Any) -> None:
        """Sync ``copy`` (or watch) until ``until()`` holds on the platform."""
        if self.how == "watch":
            if self.watcher is None:
                argv = ["sync", "--watch", "--interval", "0.2", "--runs-dir", str(self.login_runs)]
                self.watcher = procs.start(
                    [sys.executable, "-m", "primeruns", *argv],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=dict(os.environ),
                )
            wait_for(until, timeout=60, what="the watcher to ship the copy")
            return
        argv = [str(copy)] if self.how == "run" else ["--all", "--runs-dir", str(self.login_runs)]
        code, out, err = cli(self.capsys, "sync", *argv)
        assert code == 0, out + err
        assert until(), out + err

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.send_signal(signal.SIGINT)
            assert self.watcher.wait(timeout=90) == 130  # a pass under way ends first
            self.watcher = None


def _landed(lp: Any, kind: str, part: str) -> Any:
    """A predicate: the platform holds one run with every record of ``part``
    (``half`` or ``all``) exactly once in every sink; returns that run."""
    share = 2 if part == "half" else 1

    def check() -> dict[str, Any] | None:
        runs = lp.runs()
        if not runs:
            return None
        assert len(runs) == 1, f"one platform run, not {runs}"
        stored: dict[str, Any] = lp.run(runs[0]["id"])
        traces = stored["traces"]
        assert traces["episodes"] == traces["distinct_episodes"], "an episode stored twice"
        if kind == "eval":
            samples = stored["samples"]
            assert samples["rows"] == samples["distinct"], "a sample row stored twice"
            n = EVAL_EPISODES // share
            done = traces["episodes"] == n and samples["rows"] == n
        else:
            metrics = stored["train_metrics"]
            assert metrics["rows"] == metrics["steps"], "a metrics row stored twice"
            steps = TRAIN_STEPS // share
            objects = sorted(o["step"] for o in stored["parquet_objects"])
            assert len(objects) == len(set(objects)), "a step's samples stored twice"
            done = (
                traces["episodes"] == steps * PER_STEP
                and metrics["rows"] == steps
                and objects == list(range(0, steps, 10))
            )
        return stored if done else None

    return check


def _listed(capsys: pytest.CaptureFixture[str], runs: Path) -> dict[str, Any]:
    code, out, err = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    assert code == 0, err
    return {row["local_id"]: row for row in json.loads(out)}


def _status(lp: Any) -> str:
    [run] = lp.runs()
    return str(run["status"])


@pytest.mark.parametrize(
    ("kind", "ending", "host", "how"),
    COVERING + [pytest.param(*case, marks=pytest.mark.slow) for case in EVERY],
)
def test_copies_synced_from_a_login_node_land_once_in_one_run(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    ending: str,
    host: str,
    how: str,
) -> None:
    lp = local_platform
    point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    node, login = tmp_path / "node", tmp_path / "login"
    producer = Producer(node, kind, lp.url, "-" if host == "same" else "node-7")
    syncer = Syncer(how, login, capsys)
    try:
        if ending == "mid_then_after":
            copy = _copy(producer.journal, login)
            syncer.sync(copy, _landed(lp, kind, "half"))
            assert _status(lp) == "RUNNING", "closed while its producer may still write"
            row = _listed(capsys, login)[copy.name]
            assert row["synced_through"] is not None
            if host == "other":
                # Nothing here can tell whether the node's job still runs: said so.
                assert (row["outcome"], row["elsewhere"]) == ("unknown", "node-7")
            else:
                assert row["outcome"] == "running"
        producer.log_the_rest()
        if ending == "crashed":
            producer.kill()
        else:
            producer.finish()
        copy = _copy(producer.journal, login)
        syncer.sync(copy, _landed(lp, kind, "all"))
        if ending != "crashed":
            wait_for(lambda: _status(lp) == "COMPLETED", timeout=60, what="the run closed")
        elif host == "same":
            # The producer is known dead (same host, its pid gone): closed as crashed.
            wait_for(lambda: _status(lp) == "FAILED", timeout=60, what="the run closed")
        else:
            # Another host: nothing here can tell; left open until the user says.
            assert _status(lp) == "RUNNING"
            syncer.stop()
            code, out, err = cli(capsys, "sync", "--job-ended", str(copy))
            assert code == 0, out + err
            assert _status(lp) == "FAILED"
        assert _landed(lp, kind, "all")() is not None  # nothing shipped again meanwhile
    finally:
        syncer.stop()


@pytest.fixture
def login(local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The login node's copies directory, with a key to sync them to ``local_platform``."""
    point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    return tmp_path / "login"


def _requeued_job(tmp_path: Path, kind: str, url: str) -> tuple[Path, Path]:
    """A job killed on one node halfway, requeued on another under the same
    run key, and finished there: the two attempts' journals, in that order."""
    first = Producer(tmp_path / "node-a", kind, url, "node-a", "job-4242", "first")
    first.kill()
    second = Producer(tmp_path / "node-b", kind, url, "node-b", "job-4242", "second")
    second.log_the_rest()
    second.finish()
    return first.journal, second.journal


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_requeued_offline_syncs_into_one_run_by_its_run_key(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    lp = local_platform
    for journal in _requeued_job(tmp_path, kind, lp.url):
        _copy(journal, login)
    for _ in range(2):  # a second sync finds everything shipped and sends nothing twice
        code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
        assert code == 0, out + err
        assert _landed(lp, kind, "all")() is not None, out + err
        assert _status(lp) == "COMPLETED"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["all", "named"])
def test_a_requeued_job_synced_once_it_ended_closes_its_run_as_it_finished(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    how: str,
) -> None:
    """``--job-ended`` closes a journal of a run key without a finish entry as
    crashed only when no journal of its key synced with it finishes the run:
    the killed attempt, synced first, closed the run as failed although the
    requeued attempt completed it."""
    lp = local_platform
    copies = [_copy(journal, login) for journal in _requeued_job(tmp_path, kind, lp.url)]
    argv = ["--runs-dir", str(login), "--all"] if how == "all" else map(str, copies)
    code, out, err = cli(capsys, "sync", "--job-ended", *argv)
    assert code == 0, out + err
    assert _landed(lp, kind, "all")() is not None, out + err
    assert _status(lp) == "COMPLETED", out + err


# One attempt of a training job requeued under a run key: it logs steps
# FIRST to LAST (exclusive) on its node, then finishes or is killed.
_ATTEMPT = """
import os, socket, sys
import workloads
import primeruns as pr
runs, url, host, first, last, end = sys.argv[1:]
socket.gethostname = lambda: host
run = pr.init(kind="train", model="m", team_id="team", runs_dir=runs, base_url=url,
              api_key="test-key-0123456789", mode="offline", run_key="job-77")
steps = workloads.agentic_by_step(PER_STEP)
for step in range(int(first), int(last)):
    run.log_episodes(steps[step])
    run.log_metrics({"loss": 1.0}, step=step)
if end == "finish":
    run.finish(timeout=30)
os._exit(0)
"""


def test_a_step_a_requeued_attempt_logs_again_keeps_its_sample_ids_apart(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: a job requeued offline under a run
    key resumes from its last checkpoint and logs a step its killed attempt
    logged too. Each attempt's journal numbered that step's samples from 0,
    so the step's two objects held the same sample ids (a requeued job
    attached by id draws its ranges far from its predecessor's)."""
    lp = local_platform
    _attempts(lp, tmp_path, login)
    code, out, err = cli(capsys, "sync", "--job-ended", "--all", "--runs-dir", str(login))
    assert code == 0, out + err
    [run] = lp.runs()
    assert sorted(o["step"] for o in lp.run(run["id"])["parquet_objects"]) == [0, 10, 10]
    read = httpx.get(
        f"{lp.url}/api/v1/rft/runs/{run['id']}/samples",
        params={"step": 10, "limit": 100},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    ids = [sample["sample_id"] for sample in read.json()["samples"]]
    assert len(ids) == 2 * PER_STEP and len(set(ids)) == len(ids), ids


def _attempts(lp: Any, tmp_path: Path, login: Path) -> dict[str, Path]:
    """The copies of a training job's two attempts under a run key: the
    first killed at step 15, the second resumed from step 10 and finished."""
    script = _ATTEMPT.replace("PER_STEP", str(PER_STEP))
    copies = {}
    for node, first, last, end in (("node-a", 0, 15, "killed"), ("node-b", 10, 20, "finish")):
        made = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / node), lp.url, node, str(first),
             str(last), end],
            env=dict(os.environ), cwd=TESTS, timeout=120,
        )  # fmt: skip
        assert made.returncode == 0
        [journal] = [p for p in (tmp_path / node).iterdir() if not p.name.startswith(".")]
        copies[node] = _copy(journal, login)
    return copies


@pytest.mark.parametrize("order", [("node-b", "node-a"), ("node-a", "node-b")])
def test_an_attempt_synced_after_another_closed_the_run_says_how_it_was_closed(
    local_platform: Any,
    tmp_path: Path,
    login: Path,
    capsys: pytest.CaptureFixture[str],
    order: tuple[str, str],
) -> None:
    """Found by an adversarial review: the attempts of a run key synced one
    command each, the second one's close-out was sent to a run the first
    had closed (the platform keeps the first), and its report said the run
    was closed out as this attempt's own end: "crashed" for a killed
    attempt synced after the one that finished, "completed" for the one
    that finished synced after a killed one closed the run as crashed."""
    lp = local_platform
    copies = _attempts(lp, tmp_path, login)
    said = []
    for node in order:
        code, out, err = cli(capsys, "sync", "--job-ended", "--json", str(copies[node]))
        assert code == 0, out + err
        [report] = json.loads(out)
        said.append(report["status"])
    closed = _status(lp)
    assert said == [{"COMPLETED": "completed", "FAILED": "crashed"}[closed]] * 2, (said, closed)


def test_a_killed_attempt_synced_after_the_one_that_finished_closed_the_run_is_done(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: once the attempt of a run key that
    finished had closed the run, a sync of the killed attempt (without
    ``--job-ended``) said the run was left open until "the journal that
    finishes the run closes it", which it had, and never settled: every
    later ``sync --all`` shipped it again, and ``ls`` said "not closed out"."""
    lp = local_platform
    copies = _attempts(lp, tmp_path, login)
    code, out, err = cli(capsys, "sync", str(copies["node-b"]))
    assert code == 0, out + err
    assert _status(lp) == "COMPLETED"
    code, out, err = cli(capsys, "sync", "--json", str(copies["node-a"]))
    assert code == 0, out + err
    [report] = json.loads(out)
    assert (report["left_open"], report["closed_out"], report["status"]) == (
        None,
        True,
        "completed",
    ), report
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(login))
    assert code == 0, out + err
    assert "2 journal(s) already shipped and closed out" in err, out + err
    assert _status(lp) == "COMPLETED"
    [run] = lp.runs()
    assert sorted(o["step"] for o in lp.run(run["id"])["parquet_objects"]) == [0, 10, 10]


def _clean(path: Path) -> None:
    """Delete ``path`` as a tmp cleaner does, while its producer lives: its
    mover may add a spool segment meanwhile (rmtree's "Directory not
    empty"), and a cleaner goes over it again."""
    for _ in range(100):
        try:
            shutil.rmtree(path)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise AssertionError(f"{path} kept filling while it was deleted")


@pytest.mark.parametrize("kind", KINDS)
def test_a_journal_re_created_on_its_node_after_a_cleaner_deleted_it_syncs_on(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A tmp cleaner deletes the run's journal on the node mid-run; the run
    re-creates it there and logs on. Its copies, synced before and after,
    make one run with every record once: the re-created journal is the same
    journal to its sync journal, not one it refuses."""
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "node-7")
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, kind, "half")() is not None
    _clean(producer.journal)  # the node's tmp cleaner
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, kind, "all")() is not None, out + err
    assert _status(lp) == "COMPLETED"


_FORKING = """
import os, socket, sys
import workloads
import primeruns as pr
socket.gethostname = lambda: "node-7"
run = pr.init(environments=["gsm8k"], model="m", runs_dir=sys.argv[1], base_url=sys.argv[2],
              api_key="test-key-0123456789", mode="offline")
episodes = workloads.gsm8k(12)
pid = os.fork()
if pid == 0:  # a forked worker logs half
    for episode in episodes[6:]:
        run.log_episodes([episode])
    sys.exit(0)
os.waitpid(pid, 0)
for episode in episodes[:6]:
    run.log_episodes([episode])
run.finish(timeout=30)
"""


def test_a_watching_sync_closes_a_run_after_its_forked_childs_copied_records(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An offline run on a node forked a worker that logged half of its
    episodes into a journal of its own. ``sync --watch`` over the copies of
    both ships the child's before the run's, whose close-out closes the
    run, as ``--all`` does: the run is closed after every record landed."""
    lp = local_platform
    node = tmp_path / "node"
    made = subprocess.run(
        [sys.executable, "-c", _FORKING, str(node), lp.url],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=TESTS,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    for journal in node.iterdir():
        if not journal.name.startswith("."):
            shutil.copytree(journal, login / journal.name)
    syncer = Syncer("watch", login, capsys)
    try:
        syncer.sync(login, _landed(lp, "eval", "all"))
        wait_for(lambda: _status(lp) == "COMPLETED", timeout=60, what="the run closed")
    finally:
        syncer.stop()
    [run] = lp.runs()
    conn = sqlite3.connect(f"file:{lp.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        (closed,) = conn.execute(
            "SELECT finalized_at FROM evaluations WHERE id = ?", (run["id"],)
        ).fetchone()
        (latest,) = conn.execute(
            "SELECT max(ingested_at) FROM traces WHERE run_id = ?", (run["id"],)
        ).fetchone()
    finally:
        conn.close()
    assert latest <= closed, "the forked child's records landed after the run was closed"


# What damage leaves: not a spec, or an object naming no kind (which read
# with the default kind would ship a training run as an evaluation).
_DAMAGED_SPECS = pytest.mark.parametrize(
    "damaged", [{"kind": 7}, {}], ids=["not-a-spec", "no-kind"]
)


@_DAMAGED_SPECS
def test_a_journal_whose_spec_was_lost_syncs_with_the_spec_the_user_supplies(
    damaged: dict[str, Any],
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lp = local_platform
    journal_path = _offline_evaluation(lp.url, point_at(monkeypatch, tmp_path, lp.url))
    with Journal.open(journal_path) as journal:
        spec = journal.get_meta(SPEC_KEY)
        journal.set_meta(SPEC_KEY, damaged)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "sync", str(journal_path))
    assert code == 1 and "--spec FILE" in out + err
    assert lp.runs() == []
    supplied = tmp_path / "spec.json"
    supplied.write_text(json.dumps(spec))
    code, out, err = cli(capsys, "sync", "--spec", str(supplied), str(journal_path))
    assert code == 0, out + err
    assert _landed(lp, "eval", "all")() is not None
    assert _status(lp) == "COMPLETED"


def _offline_evaluation(url: str, runs: Path) -> Path:
    """An offline evaluation of ``EVAL_EPISODES`` episodes for the platform
    at ``url``, finished under ``runs``: its journal."""
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", base_url=url, runs_dir=runs)
    for episode in workloads.gsm8k(EVAL_EPISODES):
        run.log_episodes([episode])
    run.finish()
    assert run.journal_path is not None
    return run.journal_path


def test_a_copy_whose_meta_names_a_close_out_it_never_made_still_closes_its_run(
    local_platform: Any, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An offline run finished; its journal's meta names a ``finalized``
    that is no close-out's (``{}``: damage, or a tool's). Its sync ships
    every record and closes the run as the journal's finish entry says; a
    second sync sends nothing again."""
    lp = local_platform
    journal_path = _offline_evaluation(lp.url, login.parent / "runs")  # (``point_at``'s)
    with Journal.open(journal_path) as journal:
        journal.set_meta("finalized", {})
    copy = _copy(journal_path, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, "eval", "all")() is not None
    assert _status(lp) == "COMPLETED"
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, "eval", "all")() is not None


def _closed_at(lp: Any, run_id: str) -> tuple[Any, Any]:
    """An evaluation's (finalized_at, updated_at), as the platform stored them."""
    conn = sqlite3.connect(f"file:{lp.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT finalized_at, updated_at FROM evaluations WHERE id = ?", (run_id,)
        ).fetchone()
    finally:
        conn.close()
    assert row is not None
    return row[0], row[1]


def test_a_copy_of_a_run_closed_online_is_synced_without_closing_the_run_again(
    local_platform: Any, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An online evaluation shipped and closed itself; its journal is copied
    to the login node and synced there (``sync --all`` over every copy). The
    run is not closed again: an evaluation's finalize is not idempotent on
    the platform's side (it enqueues the statistics task; a repeat's answer
    is unspecified), and the SDK sends it once. Neither the metadata PUT
    nor the finalize of a close-out reaches the platform a second time."""
    lp = local_platform
    run = pr.init(
        environments=["gsm8k"], model="m", base_url=lp.url, runs_dir=login.parent / "runs"
    )
    for episode in workloads.gsm8k(EVAL_EPISODES):
        run.log_episodes([episode])
    run.finish()
    assert run.journal_path is not None and run.id is not None
    assert _status(lp) == "COMPLETED"
    before = _closed_at(lp, run.id)
    copy = _copy(run.journal_path, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _closed_at(lp, run.id) == before
    assert _landed(lp, "eval", "all")() is not None


@pytest.mark.parametrize(
    "damaged",
    [b'{"kind": 7}', b"{}", b'{"kind": "train", "mo'],
    ids=["not-a-spec", "no-kind", "not-json"],
)
def test_ls_and_show_of_a_journal_whose_spec_was_lost_name_no_sinks_and_say_how_to_ship_it(
    damaged: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    local_platform: Any,
) -> None:
    """An offline training run whose journal's spec is damaged: ``ls`` read
    it with the defaults, an evaluation's, and listed its records as pending
    to the evaluation sample table (``eval_samples``), a sink the run never
    had, saying nothing of the spec, while ``sync`` and ``replay`` refuse it
    asking for ``--spec FILE``. Now it lists them pending to sinks unknown,
    the spec damaged, and says under the table what ships it; gc keeps it.
    A spec that is not JSON was left out of the listing's meta, as none is:
    ``ls`` counted the records against an evaluation's sinks, saying nothing
    of the spec. ``show`` listed an evaluation's sinks, each with records
    pending, for any damaged spec; it says the sinks are unknown, as ``ls``."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = pr.init(kind="train", model="m", team_id="team", mode="offline", runs_dir=runs)
    run.log_episodes(workloads.agentic_by_step(2)[0])
    run.log_metrics({"loss": 1.0}, step=0)
    run.finish()
    assert run.journal_path is not None
    with Journal.open(run.journal_path) as journal:
        tx = journal._tx
        tx.write(lambda txn: tx.put_meta_bytes(txn, SPEC_KEY, damaged))
    row = _listed(capsys, runs)[run.journal_path.name]
    assert "eval_samples" not in row["pending"] and "traces" not in row["pending"], row
    # Its 2 episodes and 1 metrics row, to whichever sinks the run has.
    assert row["pending"] == {"sinks unknown (spec damaged)": 3}, row
    assert (row["spec_damaged"], row["shipping"]) == (True, "spec damaged"), row
    code, out, err = cli(capsys, "ls", "--runs-dir", str(runs))
    assert code == 0, err
    said = " ".join(out.split())
    assert "whose spec is damaged" in said and "--spec FILE" in said, out
    code, out, err = cli(capsys, "show", str(run.journal_path), "--json")
    shown = json.loads(out)
    assert shown["sinks"] == [] and shown["spec_damaged"], shown
    assert shown["pending"] == {"sinks unknown (spec damaged)": 3}, shown
    code, out, err = cli(capsys, "show", str(run.journal_path))
    said = " ".join(out.split())
    assert "eval_samples" not in said, out
    assert "sinks unknown (spec damaged) 3 records pending" in said, out
    assert "--spec FILE" in said, out
    code, out, err = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--json")
    assert code == 0, err
    assert [k["local_id"] for k in json.loads(out)["kept"]] == [run.journal_path.name], out


def test_a_config_edited_before_finish_lands_from_a_copy_synced_mid_run_before(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found by an adversarial review: an evaluation's ``run.config`` edited
    before ``finish()`` is stored in its journal's spec at the finish. Its
    sync journal, made from a copy taken mid-run, kept the spec of that
    copy, and the run was closed with the config as it was at ``init()``."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", base_url=lp.url,
                  runs_dir=runs, config={"lr": 1})  # fmt: skip
    episodes = workloads.gsm8k(EVAL_EPISODES)
    for episode in episodes[:6]:
        run.log_episodes([episode])
    assert run.journal_path is not None
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    login = tmp_path / "login"
    copy = _copy(run.journal_path, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0 and _status(lp) == "RUNNING", out + err
    for episode in episodes[6:]:
        run.log_episodes([episode])
    run.config["best"] = 0.9
    run.finish()
    copy = _copy(run.journal_path, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    stored = _landed(lp, "eval", "all")()
    assert stored is not None and _status(lp) == "COMPLETED"
    assert stored["config"]["lr"] == 1 and stored["config"].get("best") == 0.9


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_copy_of_a_run_that_finished_here_never_closes_it_as_crashed(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "-")
    stale = _copy(producer.journal, login)  # taken mid-run
    producer.log_the_rest()
    producer.finish()  # the producer is gone: only its original has the finish
    code, out, err = cli(capsys, "sync", str(stale))
    assert code == 0, out + err
    assert _status(lp) == "RUNNING" and "left open" in out
    _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(stale))
    assert code == 0, out + err
    assert _landed(lp, kind, "all")() is not None
    assert _status(lp) == "COMPLETED"


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_cut_short_of_a_run_that_finished_here_never_closes_it_as_crashed(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Found by an adversarial review: a copy of a finished run whose
    ``cp`` was cut short (its data.mdb half copied: interrupted, a full
    quota, or still being copied) is damaged; its producer is known gone, so
    it was taken as final, rebuilt and the run closed as crashed for good,
    although the original beside it holds the finish."""
    lp = local_platform
    producer = Producer(tmp_path / "node", kind, lp.url, "-")
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    data = copy / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    code, out, err = cli(capsys, "sync", str(copy))
    assert _status(lp) == "RUNNING" and "left open" in out, out + err
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert _landed(lp, kind, "all")() is not None
    assert _status(lp) == "COMPLETED"


@pytest.mark.parametrize("how", ["mid-run", "cut short"])
def test_a_copy_behind_a_run_that_finished_here_never_closes_it_once_its_job_ended(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """Found by an adversarial review: ``--job-ended`` (the job did end)
    took a copy as final even where its original beside it holds more, the
    finish among it: a copy taken mid-run, or one whose ``cp`` was cut
    short, closed the run as crashed for good. The job's end makes a copy
    final only where it is not behind its original."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "-")
    copy = _copy(producer.journal, login)
    producer.log_the_rest()
    producer.finish()
    if how == "cut short":
        copy = _copy(producer.journal, login)
        os.truncate(copy / "data.mdb", (copy / "data.mdb").stat().st_size // 2)
    code, out, err = cli(capsys, "sync", "--job-ended", str(copy))
    assert _status(lp) == "RUNNING" and "left open" in out, out + err
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", "--job-ended", str(copy))
    assert code == 0, out + err
    assert _landed(lp, "eval", "all")() is not None
    assert _status(lp) == "COMPLETED"


def test_a_run_closed_as_crashed_is_not_reported_closed_as_completed_by_a_later_copy(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: a run closed as crashed (a copy
    synced with ``--job-ended`` before its job had ended) stays so on the
    platform, but a sync of a later copy holding the finish said "run
    closed out as completed"."""
    lp = local_platform
    producer = Producer(tmp_path / "node", "eval", lp.url, "node-7")
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", "--job-ended", str(copy))
    assert code == 0 and _status(lp) == "FAILED", out + err
    producer.log_the_rest()
    producer.finish()
    copy = _copy(producer.journal, login)
    code, out, err = cli(capsys, "sync", "--json", str(copy))
    [report] = json.loads(out)
    assert code == 0 and report["closed_out"], out + err
    assert report["status"] == "crashed", out + err
    assert _landed(lp, "eval", "all")() is not None and _status(lp) == "FAILED"


def test_watching_refuses_to_close_runs_as_crashed(
    login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "sync", "--watch", "--job-ended", "--runs-dir", str(login))
    assert code == 2 and "--job-ended cannot go with --watch" in out + err


def _objects_and_status(lp: Any) -> tuple[list[int], str] | None:
    """The steps of the one training run's sample objects, and its status."""
    runs = lp.runs()
    if len(runs) != 1:
        return None
    steps = sorted(o["step"] for o in lp.run(runs[0]["id"])["parquet_objects"])
    return steps, str(runs[0]["status"])


def test_a_watching_sync_closes_a_run_keys_run_after_the_attempt_that_did_not_finish(
    local_platform: Any, tmp_path: Path, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: the copies of a run key's two attempts
    met by one pass of ``sync --watch`` shipped in the order of their names,
    as it could not tell the attempt that finished (``sync --all`` can): the
    requeued attempt's node, its clock behind, named its journal first, so
    its close-out closed the run before the killed attempt's records landed."""
    lp = local_platform
    copies = _attempts(lp, tmp_path, login)
    # The requeued attempt's name sorts first, as under a clock hours behind.
    copies["node-b"].rename(login / "0-requeued")
    copies["node-a"].rename(login / "1-killed")
    syncer = Syncer("watch", login, capsys)
    try:
        syncer.sync(login, lambda: _objects_and_status(lp) == ([0, 10, 10], "COMPLETED"))
    finally:
        syncer.stop()
    [run] = lp.runs()
    assert closed_after_every_record(lp.data_dir, run["id"]), (
        "closed before the killed attempt's records"
    )


def test_show_of_a_copy_whose_spec_is_damaged_names_its_sync_journals_sinks(
    local_platform: Any, login: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy synced whole, then copied again over a bad disk: its own spec
    no longer reads, its sync journal's (which ships it) does. Before,
    ``show`` read the copy's alone: an evaluation's sinks for a training
    run, its sample table among them, and no kind."""
    lp = local_platform
    runs = login.parent / "node"
    run = pr.init(
        kind="train", model="m", team_id="team", mode="offline", base_url=lp.url, runs_dir=runs
    )
    run.log_episodes(workloads.agentic_by_step(2)[0])
    run.log_metrics({"loss": 1.0}, step=0)
    run.finish()
    assert run.journal_path is not None
    copy = _copy(run.journal_path, login)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    code, out, err = cli(capsys, "show", str(copy), "--json")
    sound = json.loads(out)
    with Journal.open(copy) as journal:
        tx = journal._tx
        tx.write(lambda txn: tx.put_meta_bytes(txn, SPEC_KEY, b"not json"))
    code, out, err = cli(capsys, "show", str(copy), "--json")
    assert code == 0, out + err
    shown = json.loads(out)
    assert [s["sink"] for s in shown["sinks"]] == [s["sink"] for s in sound["sinks"]], shown
    assert "eval_samples" not in [s["sink"] for s in shown["sinks"]], shown
    assert shown["spec"]["kind"] == "train", shown
    assert not shown["spec_damaged"], shown
    assert lp.runs() and shown["shipping"] == sound["shipping"], shown
