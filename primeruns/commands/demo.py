"""``primeruns demo``: the whole story in under a minute, on this machine.

Starts the embedded local platform (unless ``--base-url``), then through a
simulated flaky network (retryable and ambiguous failures injected by the
platform) runs a short evaluation and a short training run from the bundled
demo data, starts a producer process and SIGKILLs it mid-run (its uplink
ships what it logged and closes the run as crashed, with no command run),
replays its journal anyway with the very code of ``primeruns replay`` (a
harmless no-op by then), and verifies on the
platform's inspection API (``/_local/runs/{id}``) that every record landed
exactly once with the right status. Exit 0 only if every check passed.

The demo's API key is made up here; it reaches the SDK as ``init(api_key=)``
and the producer through its environment, never a command line or output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.text import Text

import primeruns as pr

from ..journal import EntryKind, Journal
from ..journal.lock import owner_alive, read_owner
from ..journal.trust import make_private_folder
from ..metrics import from_episodes
from ..reports import load_rows
from ..settings import (
    API_BASE_URL_ENV,
    API_KEY_ENV,
    BASE_URL_ENV,
    FRONTEND_URL_ENV,
    MODE_ENV,
    RETRY_BASE_ENV,
    RUNS_DIR_ENV,
    TRACES_OPT_OUT_ENV,
    TRACES_URL_ENV,
    resolve_settings,
)
from .common import EXIT_FAILED, EXIT_OK, CommandError
from .console import make_console
from .demo_data import eval_episodes, train_episodes
from .replay import replay_one

__all__ = ["add_parser"]

RETRYABLE_RATE = 0.2
AMBIGUOUS_RATE = 0.05
KILL_AFTER = 12  # episodes the producer logs before it is killed
UPLINK_TIMEOUT_S = 90.0  # for the killed producer's uplink to close its run
PRODUCER_TIMEOUT_S = 60.0
EXIT_TERMINATED = 143  # the shells' code for a process ended by SIGTERM


@dataclass
class Check:
    what: str
    ok: bool
    detail: str = ""


class Demo:
    """One demo: a platform URL, a runs directory, the checks as they pass or fail."""

    def __init__(self, url: str, key: str, workdir: Path, console: Console) -> None:
        self.url = url
        self.key = key
        self.workdir = workdir
        self.runs = workdir / "runs"
        self.console = console
        self.checks: list[Check] = []
        # The platform's inspection routes want the key like its API.
        self.http = httpx.Client(
            base_url=url, timeout=10.0, headers={"Authorization": f"Bearer {key}"}
        )
        self.killed_journal: Path | None = None  # its uplink may still run

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(what, ok, detail))
        line = Text("  ")
        line.append("✓" if ok else "✗", style="green" if ok else "red")
        line.append(f" {what}" + (f": {detail}" if detail else ""))
        self.console.print(line)
        return ok

    def heading(self, title: str) -> None:
        self.console.print(Text(title, style="bold"))

    def stored(self, run_id: str) -> dict[str, Any]:
        response = self.http.get(f"/_local/runs/{run_id}")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def faults(self, retryable: float, ambiguous: float) -> None:
        body = {"retryable_rate": retryable, "ambiguous_rate": ambiguous}
        with contextlib.suppress(httpx.HTTPError):
            self.http.post("/_local/faults", json=body)

    def _landed(self, stored: dict[str, Any], n: int, label: str) -> None:
        traces = stored["traces"]
        self.check(
            f"{label}: {n} episodes in Prime Traces exactly once",
            traces["episodes"] == traces["distinct_episodes"] == n,
            f"rows {traces['episodes']}, distinct {traces['distinct_episodes']}",
        )

    # -- the three runs -----------------------------------------------------------

    def eval_run(self) -> None:
        self.heading("1. an evaluation run (30 gsm8k episodes, flaky network)")
        episodes = eval_episodes()
        run = pr.init(
            name="demo-gsm8k",
            environments=["gsm8k"],
            model="Qwen/Qwen3-8B",
            framework="verifiers",
            mode="online",
            api_key=self.key,
            base_url=self.url,
            runs_dir=self.runs,
            traces_opt_out=False,
        )
        for i in range(0, len(episodes), 5):
            run.log_episodes(episodes[i : i + 5])
        run.finish(summary=dict(from_episodes(episodes)), timeout=60)
        stored = self.stored(run.id)
        self.check(*_closed_as("the eval run", "COMPLETED", stored["status"]))
        self._landed(stored, len(episodes), "eval")
        samples = stored["samples"]
        self.check(
            f"eval: {len(episodes)} samples exactly once",
            samples["rows"] == samples["distinct"] == len(episodes),
            f"rows {samples['rows']}, distinct {samples['distinct']}",
        )

    def train_run(self) -> None:
        self.heading("2. a training run (4 steps x 3 agentic episodes, flaky network)")
        steps = train_episodes()
        run = pr.init(
            name="demo-train",
            kind="train",
            model="Qwen/Qwen3-8B",
            team_id="demo-team",
            mode="online",
            api_key=self.key,
            base_url=self.url,
            runs_dir=self.runs,
            traces_opt_out=False,
        )
        total = 0
        for step, episodes in steps.items():
            run.log_episodes(episodes)
            total += len(episodes)
            agg = from_episodes(episodes)
            row = {
                "reward": agg["avg_reward"],
                "error_rate": agg["avg_error"],
                **agg["avg_metrics"],
            }
            run.log_metrics(row, step=step)
        run.finish(timeout=60)
        stored = self.stored(run.id)
        self.check(*_closed_as("the training run", "COMPLETED", stored["status"]))
        self._landed(stored, total, "train")
        metrics = stored["train_metrics"]
        self.check(
            f"train: {len(steps)} metric rows, one per step",
            metrics["rows"] == metrics["steps"] == len(steps),
            f"rows {metrics['rows']}, steps {metrics['steps']}",
        )
        self.train_local_id = run.journal_path.name if run.journal_path else ""

    def crash_and_replay(self) -> None:
        self.heading(
            "3. a producer killed with SIGKILL mid-run: its uplink ships what it logged "
            "and closes the run"
        )
        journal_path, run_id, acked = self._kill_producer()
        self.killed_journal = journal_path
        if journal_path is None or run_id is None:
            return
        with Journal.open(journal_path, owner=False) as journal:
            damage: list[Any] = []
            rows = load_rows(journal, {EntryKind.EPISODE}, damage)
            finished = bool(journal.read(0, kinds={EntryKind.FINISH}, max_entries=1).entries)
        journaled = [str(r.get("id")) for r in rows]
        self.check(
            f"killed after {len(acked)} acknowledged log_episodes calls, before finishing",
            bool(acked) and not finished,
            f"{len(journaled)} episodes in the journal",
        )
        self.check(
            "every acknowledged episode is in the journal",
            set(acked) <= set(journaled) and not damage,
        )
        print("  waiting for the uplink, with no command run ...", flush=True)
        waited = time.monotonic()
        done = _wait_owner_gone(journal_path, UPLINK_TIMEOUT_S)
        self.check(
            "the uplink shipped it and closed the run by itself",
            done,
            f"in {time.monotonic() - waited:.1f} s"
            if done
            else f"still shipping after {UPLINK_TIMEOUT_S:.0f} s",
        )
        self.faults(0.0, 0.0)  # the replay and the checks see the truth, not faults
        print(f"  $ primeruns replay {journal_path}", flush=True)
        code = replay_one(journal_path, base_url=self.url, timeout=60)
        self.check(
            "replaying it anyway is harmless", code == 0, "" if code == 0 else f"exit {code}"
        )
        stored = self.stored(run_id)
        self.check(
            "killed run FAILED with a crash reason",
            stored["status"] == "FAILED" and bool(stored.get("error_message")),
            f"{stored['status']}: {stored.get('error_message')}",
        )
        self._landed(stored, len(journaled), "killed run")
        samples = stored["samples"]
        self.check(
            f"killed run: {len(journaled)} samples exactly once",
            samples["rows"] == samples["distinct"] == len(journaled),
            f"rows {samples['rows']}, distinct {samples['distinct']}",
        )
        self.crashed_local_id = journal_path.name

    def _kill_producer(self) -> tuple[Path | None, str | None, list[str]]:
        log_path = self.workdir / "producer.log"
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "primeruns.commands.demo_producer",
                    str(self.runs),
                    self.url,
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                env=dict(os.environ),  # carries PRIME_API_KEY: never put it on argv
            )
        # A watchdog: a wedged producer must not wedge the demo.
        watchdog = threading.Timer(PRODUCER_TIMEOUT_S, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            journal_path: Path | None = None
            run_id: str | None = None
            acked: list[str] = []
            while len(acked) < KILL_AFTER:
                line = proc.stdout.readline()
                if not line:
                    break
                word, _, value = line.strip().partition(" ")
                if word == "journal":
                    journal_path = Path(value)
                elif word == "run":
                    run_id = value
                elif word == "logged":
                    acked.append(value)
            os.kill(proc.pid, signal.SIGKILL)
            rest, _ = proc.communicate(timeout=30)
        finally:
            watchdog.cancel()
            if proc.poll() is None:  # the demo itself was stopped meanwhile
                proc.kill()
                proc.wait()
        # Lines printed after the last one read were acknowledged too.
        for line in rest.splitlines():
            word, _, value = line.strip().partition(" ")
            if word == "logged":
                acked.append(value)
        ok = journal_path is not None and run_id is not None and len(acked) >= KILL_AFTER
        if not ok:
            tail = log_path.read_text(errors="replace")[-1500:]
            self.check("the producer ran until it was killed", False, tail)
        return journal_path, run_id, acked


def _closed_as(what: str, expected: str, status: str) -> tuple[str, bool, str]:
    """A check's words: the detail says only what differs from what was expected."""
    ok = status == expected
    return f"{what} is closed as {expected.lower()}", ok, "" if ok else f"it is {status}"


def _wait_owner_gone(journal: Path, timeout: float) -> bool:
    """Wait until no process owns ``journal`` (the killed producer's uplink is
    done): on the uplink's exit, through a pidfd (not a child of this process)."""
    from ..journal.lock import owner_alive, read_owner

    owner = read_owner(journal)
    if owner is not None and owner.helper_pid is not None and owner_alive(owner):
        try:
            pidfd = os.pidfd_open(owner.helper_pid)
        except OSError:
            pass  # gone already
        else:
            try:
                # In slices of a second: a SIGTERM or Ctrl-C landing on a
                # wait's way in is handled when that wait ends (CPython).
                deadline = time.monotonic() + timeout
                while (left := deadline - time.monotonic()) > 0:
                    if select.select([pidfd], [], [], min(left, 1.0))[0]:
                        break
            finally:
                os.close(pidfd)
    return not owner_alive(read_owner(journal))


@contextlib.contextmanager
def _demo_environment(url: str, key: str) -> Iterator[None]:
    """The demo's own settings, restored afterwards: quick retries, traces and
    page links on the demo platform, the demo key, and nothing inherited that
    would redirect or disable the runs."""
    changes: dict[str, str | None] = {
        API_KEY_ENV: key,
        TRACES_URL_ENV: url,
        FRONTEND_URL_ENV: url,
        RETRY_BASE_ENV: "0.02",
        API_BASE_URL_ENV: None,
        BASE_URL_ENV: None,
        MODE_ENV: None,
        TRACES_OPT_OUT_ENV: None,
        RUNS_DIR_ENV: None,
    }
    saved = {k: os.environ.get(k) for k in changes}
    for k, v in changes.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


class _Terminated(Exception):
    """SIGTERM arrived: stop the platform and clean up on the way out."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the platform process and the temporary
    directory never outlive the demo (only the main thread can set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_uplink(journal: Path) -> None:
    """SIGTERM the killed producer's uplink if it still ships (it runs in a
    session of its own, so nothing else reaches it): nothing it would ship
    outlives the demo's platform and directory."""
    info = read_owner(journal)
    if info is not None and info.helper_pid is not None and owner_alive(info):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(info.helper_pid, signal.SIGTERM)


def _where_to_look(console: Console, demo: Demo, url: str, serving: bool, kept: bool) -> None:
    console.print("where to look:")
    console.print(
        f"  the platform's page:   {url}/" + ("" if serving else "  (stopped; see --keep-serving)")
    )
    if not kept:
        console.print(
            "  the journals were in a temporary directory, removed at the end: "
            "pass --dir DIR to keep them"
        )
        return
    console.print(f"  the journals:          primeruns ls --runs-dir {demo.runs}")
    crashed = getattr(demo, "crashed_local_id", None)
    if crashed:
        console.print(f"  the crashed run:       primeruns show --runs-dir {demo.runs} {crashed}")
    train = getattr(demo, "train_local_id", None)
    if train:
        console.print(f"  the training curves:   primeruns show --runs-dir {demo.runs} {train}")


def run_demo(args: argparse.Namespace) -> int:
    """Start the local platform on a free port (or use --base-url), run a short
    eval and a short training run from bundled data through a flaky network,
    SIGKILL a producer mid-run (its uplink closes it), replay it anyway,
    verify every record landed exactly once with the right status, and print
    where to look. Without --dir, everything is in a temporary directory that
    is removed at the end (with --keep-serving, when the serving stops). Exit 0
    if all passed."""
    from ..local import LocalPlatform

    started = time.monotonic()
    console = make_console()
    temporary = not args.dir
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="primeruns-demo-"))
    platform: LocalPlatform | None = None
    demo: Demo | None = None
    terminated = False
    try:
        with _terminable():
            make_private_folder(
                workdir,
                "demo directory",
                advice="pass --dir a directory of your own that only you can write into",
            )
            if args.base_url:
                url = args.base_url.rstrip("/")
                key = resolve_settings().api_key
                if not key:
                    raise CommandError("--base-url needs the platform's API key in PRIME_API_KEY")
            else:
                key = f"demo-{secrets.token_urlsafe(18)}"
                console.print(f"starting the local platform (data in {workdir / 'platform'}) ...")
                platform = LocalPlatform(workdir / "platform", api_key=key)
                url = platform.start().url
            with _demo_environment(url, key):
                demo = Demo(url, key, workdir, console)
                console.print(
                    f"platform {url}; injecting faults: {RETRYABLE_RATE:.0%} retryable, "
                    f"{AMBIGUOUS_RATE:.0%} ambiguous (committed, answer lost)"
                )
                demo.faults(RETRYABLE_RATE, AMBIGUOUS_RATE)
                try:
                    demo.eval_run()
                    demo.train_run()
                    demo.crash_and_replay()
                except (httpx.HTTPError, pr.PrimeRunsError, pr.APIError, KeyError, OSError) as exc:
                    demo.check("the demo ran to the end", False, f"{type(exc).__name__}: {exc}")
                finally:
                    demo.faults(0.0, 0.0)
                    demo.http.close()
            passed = all(c.ok for c in demo.checks)
            elapsed = time.monotonic() - started
            console.print()
            verdict = (
                Text("all checks passed", style="green")
                if passed
                else Text("some checks FAILED", style="red")
            )
            verdict.append(
                f" ({sum(c.ok for c in demo.checks)}/{len(demo.checks)}, {elapsed:.1f} s)"
            )
            console.print(verdict)
            serving = args.keep_serving and platform is not None
            _where_to_look(
                console, demo, url, serving or platform is None, not temporary or serving
            )
            if args.json_report:
                report = [{"what": c.what, "ok": c.ok, "detail": c.detail} for c in demo.checks]
                Path(args.json_report).write_text(json.dumps(report, indent=2))
            if serving and platform is not None:
                console.print(f"serving {url}/ until Ctrl-C or SIGTERM ...")
                with contextlib.suppress(KeyboardInterrupt, _Terminated):
                    platform.wait()
            return EXIT_OK if passed else EXIT_FAILED
    except _Terminated:
        terminated = True
        return EXIT_TERMINATED
    finally:
        if demo is not None and demo.killed_journal is not None:
            _stop_uplink(demo.killed_journal)
        if platform is not None:
            platform.stop()
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)
        if terminated:
            print(
                "primeruns demo: terminated; its platform is stopped"
                + (" and its temporary directory removed" if temporary else ""),
                file=sys.stderr,
            )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="see it work: a local platform, a flaky network, a crash and a replay",
        description=run_demo.__doc__,
    )
    parser.add_argument("--base-url", help="use this (primeruns serve) platform instead")
    parser.add_argument(
        "--keep-serving",
        action="store_true",
        help="keep the local platform up afterwards, until Ctrl-C or SIGTERM",
    )
    parser.add_argument(
        "--dir",
        help="where to put the demo's runs and data, kept afterwards "
        "(default: a temporary directory, removed at the end)",
    )
    parser.add_argument("--json-report", metavar="FILE", help=argparse.SUPPRESS)
    parser.set_defaults(handler=run_demo)
