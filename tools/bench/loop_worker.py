"""One training-like loop for ``uplink_loop.py``, run as its own process.

``python loop_worker.py SDK EPISODES URL RUNS_DIR STEPS WORK`` runs STEPS
steps of: WORK pure-Python iterations (the user's own work, holding the GIL
as a training loop's Python does), then ``log_episodes`` of 8 episodes and
one ``log_metrics`` row. SDK is ``none`` (the loop alone), ``offline``,
``online`` (this SDK as shipped: the uplink process), ``threads`` (this SDK
shipping from threads in the producer: ``PRIME_RUNS_UPLINK=threads``) or
``vendor`` (``prime_runs`` 0.1.4, run with the vendor's virtual environment's
python). It prints one JSON line: the loop's wall time, each step's log time,
init→finish wall time, and the CPU seconds of this process and of its
children (the uplink, reaped before the figure is taken).

With ``LOOP_KIND=eval`` in the environment the run is an evaluation
instead: its episodes are evaluation episodes, and no metrics row is logged
(an evaluation has none). The JSON line then holds each log call's start,
in seconds from ``init``'s return (``at_s``), to tell an evaluation's first
seconds (this SDK ships them from threads in the producer) from the rest.

Each step's log time comes with the part of it the thread spent waiting for
a CPU, runnable but not running (``waits_s``: Linux's per-thread
``schedstat``; zeros where there is none). On a loaded 2-core host that wait
was nearly all of the slowest calls' time (15-60 ms preempted, 0.2-1.6 ms
on the CPU, well under 1 ms blocked): a p99 that moves with it is the
host's, not the SDK's, and the p99 of the log times less their waits tells
the two apart (though a wait that a call's own wake-up of another thread
brought on is in it too).

It imports only the standard library before choosing the SDK, so the
vendor's interpreter (which has no ``primeruns``) can run it too.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

API_KEY = "bench-key-0123456789"
TEAM = "team-bench"
PER_STEP = 8


def cpu_wait_s() -> float:
    """Seconds this thread has spent runnable and waiting for a CPU (the
    second field of Linux's ``/proc/thread-self/schedstat``); 0.0 where
    the system does not tell."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


EVAL = os.environ.get("LOOP_KIND") == "eval"


def step_batches(episodes: list[dict[str, Any]], steps: int) -> list[list[dict[str, Any]]]:
    """PER_STEP episodes per step (training episodes of that step, unless
    ``EVAL``), with ids made unique per step."""
    batches = []
    for step in range(steps):
        batch = []
        for i in range(PER_STEP):
            episode = dict(episodes[(step * PER_STEP + i) % len(episodes)])
            episode["id"] = f"{episode.get('id')}-s{step}-{i}"
            if not EVAL:
                episode["run"] = {"type": "train", "work": {"type": "train", "step": step}}
            batch.append(episode)
        batches.append(batch)
    return batches


def _init(sdk: str, url: str, runs_dir: str, steps: int) -> Any:
    common: dict[str, Any] = {
        "name": f"bench-loop-{sdk}",
        "model": "Qwen/Qwen3-8B",
        "api_key": API_KEY,
        "base_url": url,
    }
    if EVAL:
        common.update(environments=["gsm8k"], framework="verifiers")
    else:
        common.update(kind="train", team_id=TEAM)
    if sdk == "vendor":
        import prime_runs

        if EVAL:
            return prime_runs.init(**common)
        return prime_runs.init(**common, training=prime_runs.TrainingSpec(max_steps=steps))
    if sdk == "threads":
        os.environ["PRIME_RUNS_UPLINK"] = "threads"
    import primeruns

    mode = "offline" if sdk == "offline" else "online"
    if EVAL:
        return primeruns.init(**common, mode=mode, runs_dir=runs_dir)
    spec = primeruns.TrainingSpec(max_steps=steps)
    return primeruns.init(**common, training=spec, mode=mode, runs_dir=runs_dir)


def main(argv: list[str]) -> int:
    sdk, episodes_path, url, runs_dir, steps_s, work_s = argv
    steps, n = int(steps_s), int(work_s)
    with open(episodes_path, "rb") as f:
        episodes = [json.loads(line) for line in f if line.strip()]
    batches = step_batches(episodes, steps)
    if sdk == "vendor":
        import prime_runs  # noqa: F401  (imported before the clock starts, as ours is)
    elif sdk != "none":
        import primeruns  # noqa: F401
    wall0 = time.perf_counter()
    run = None if sdk == "none" else _init(sdk, url, runs_dir, steps)
    loop0 = time.perf_counter()
    logs: list[float] = []
    waits: list[float] = []
    at: list[float] = []
    for step in range(steps):
        work(n)
        waited = cpu_wait_s()
        t = time.perf_counter()
        if run is not None:
            run.log_episodes(batches[step])
            if not EVAL:
                run.log_metrics({"loss": 1.0 / (step + 1), "reward": step / steps}, step=step)
        logs.append(time.perf_counter() - t)
        waits.append(cpu_wait_s() - waited)
        at.append(t - loop0)
    loop1 = time.perf_counter()
    if run is not None:
        run.finish()
    wall1 = time.perf_counter()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "sdk": sdk,
                "run_id": None if run is None else run.id,
                "loop_s": loop1 - loop0,
                "logs_s": logs,
                "waits_s": waits,
                "at_s": at,
                "init_to_finish_s": wall1 - wall0,
                "cpu_s": own.ru_utime + own.ru_stime,
                "child_cpu_s": children.ru_utime + children.ru_stime,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
