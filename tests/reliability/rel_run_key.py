"""A process of a run key, as the reliability tests of run keys run it
(``test_rel_run_key_*``): an evaluation of gsm8k episodes under one
``run_key``, each process a fresh interpreter, ended as the test says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import procs

from primeruns.local import LocalPlatform

KEY = "test-key-0123456789"
RUN_KEY = "requeued-job-7"

# argv: runs dir, base url, first episode, count, ending, then the API key
# and the run key. ending "finish": log and finish. "hang" (a process to
# SIGKILL): wait for a line on stdin before logging, then for the kill.
# "closeout-fails": log, wait until every record shipped, say so and wait
# for a line on stdin (the test fails the platform's close-out calls
# meanwhile), then finish within 3 s.
PRODUCER = """
import signal, sys
import workloads
import primeruns as pr
runs, url, first, n, ending, key, run_key = sys.argv[1:8]
run = pr.init(environments=["gsm8k"], model="m", api_key=key, base_url=url, runs_dir=runs,
              run_key=run_key)
print("journal", run.journal_path, flush=True)
if ending == "hang":
    sys.stdin.readline()
episodes = workloads.gsm8k(int(first) + int(n))[int(first):]
for i in range(0, len(episodes), 10):
    run.log_episodes(episodes[i : i + 10])
print("logged", " ".join(e["id"] for e in episodes), flush=True)
if ending == "hang":
    while True:
        signal.pause()  # until the test's SIGKILL
if ending == "closeout-fails":
    assert run.flush(timeout=60)
    print("flushed", flush=True)
    sys.stdin.readline()
run.finish(timeout=3 if ending == "closeout-fails" else 60)
print("finished", flush=True)
"""


def producer(runs: Path, lp: LocalPlatform, first: int, n: int, ending: str) -> list[str]:
    """The command line of one process of the run key, logging episodes
    ``first`` to ``first + n`` to ``lp``, ended by ``ending``."""
    return [
        sys.executable,
        "-c",
        PRODUCER,
        str(runs),
        lp.url,
        str(first),
        str(n),
        ending,
        KEY,
        RUN_KEY,
    ]


def start(
    runs: Path, lp: LocalPlatform, first: int, n: int, ending: str, env: dict[str, str]
) -> tuple[subprocess.Popen[str], Path]:
    """Start a process of the run key (``producer``), its stdin and stdout
    piped: it and its journal, once it said which."""
    return started(producer(runs, lp, first, n, ending), env)


def started(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], Path]:
    """Start the process ``argv`` that prints ``journal <path>`` first, its
    stdin and stdout piped: it and its journal, once it said which."""
    proc = procs.start(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    return proc, Path(proc.stdout.readline().split(" ", 1)[1].strip())


def killed_leaving_all(
    runs: Path, lp: LocalPlatform, n: int, env: dict[str, str]
) -> tuple[Path, list[str]]:
    """A process of the run key, in threads mode (``env``), that registered
    and logged ``n`` episodes, none of which shipped before its SIGKILL (the
    platform answers their uploads 503 meanwhile: a deterministic stand-in
    for threads that lingered): its journal and the episode ids it logged."""
    proc, journal = start(runs, lp, 0, n, "hang", env)
    assert proc.stdin is not None and proc.stdout is not None
    lp.set_faults(
        retryable_rate=1.0, statuses=[503], routes=["/api/v1/evaluations/", "/api/v1/traces"]
    )
    try:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        logged = proc.stdout.readline().split()[1:]
        assert len(logged) == n
        procs.kill_job(proc)
        proc.wait(timeout=60)
    finally:
        lp.set_faults(retryable_rate=0.0, statuses=[503, 502, 429], routes=[])
    return journal, logged


def at_once(argvs: list[list[str]], env: dict[str, str], timeout: float) -> list[dict[str, str]]:
    """Start the processes ``argvs`` at once and wait for each to exit 0:
    what each printed, its lines ``<word> <rest>`` as a mapping."""
    started = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for argv in argvs
    ]
    return _said(started, timeout)


#: Set in the environment of processes started by ``together``.
TOGETHER = "PRIMERUNS_TEST_TOGETHER"


def together(argvs: list[list[str]], env: dict[str, str], timeout: float) -> list[dict[str, str]]:
    """As ``at_once``, for processes that, with ``TOGETHER`` set, print
    ``ready`` once started (the interpreter up, what they import imported)
    and then wait for a line on stdin: all are told to go once all are
    ready, so their work begins at one moment however long each took to
    start (several seconds each, one after another, on a loaded host)."""
    started = [
        subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, TOGETHER: "1"},
        )
        for argv in argvs
    ]
    for proc in started:
        assert proc.stdout is not None
        if proc.stdout.readline() != "ready\n":  # it ended (or said something else) first
            for each in started:
                each.kill()
            errors = [each.communicate(timeout=timeout)[1] for each in started]
            raise AssertionError(f"not ready: {errors[started.index(proc)][-2000:]}")
    for proc in started:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return _said(started, timeout)


def _said(started: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, str]]:
    """Wait for each of ``started`` to exit 0: what each printed, its lines
    ``<word> <rest>`` as a mapping."""
    said: list[dict[str, str]] = []
    for proc in started:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr[-2000:]
        said.append(dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line))
    return said
