"""The producer of the configuration matrix (``matrix.py``): one run, logged
from one or several threads, ended the way the trial asks.

Usage: python matrix_producer.py RUNS_DIR BASE_URL KIND THREADS N ENDING NAME [RUN_ID]

- KIND ``eval`` logs N gsm8k episodes; ``train`` logs N steps of one agentic
  episode and one metrics row each (steps spread over the threads).
- pyarrow is hidden by the harness (``tests/data/without_pyarrow`` first on
  ``PYTHONPATH``), from this process and its uplink alike.
- Every record is printed (``ok episode ID`` / ``ok metrics STEP``) once the
  ``log_*`` call holding it returned, then ``logged all``; the producer then
  waits for a line on stdin (the harness brings the platform back first).
- ENDING: ``finish``, ``exception`` (an exception leaves ``with run:``),
  ``sigterm`` / ``sigkill`` (prints ``ready`` and waits for the signal).
- An ``init()`` refusal prints ``init-error MESSAGE`` and exits 3.
"""

from __future__ import annotations

import sys
import threading
import time

import workloads

import primeruns as pr

KEY = "test-key-0123456789"


def main() -> int:
    runs_dir, base_url, kind, threads, n, ending, name = sys.argv[1:8]
    run_id = sys.argv[8] if len(sys.argv) > 8 else None
    try:
        if kind == "train":
            run = pr.init(
                kind="train",
                name=name,
                id=run_id,
                model="m",
                team_id="team-a",
                api_key=KEY,
                base_url=base_url,
                runs_dir=runs_dir,
            )
        else:
            run = pr.init(
                name=name,
                environments=["gsm8k"],
                model="m",
                api_key=KEY,
                base_url=base_url,
                runs_dir=runs_dir,
            )
    except pr.PrimeRunsError as exc:
        print(f"init-error {exc}", flush=True)
        return 3
    print(f"journal {run.journal_path}", flush=True)
    printing = threading.Lock()

    def say(line: str) -> None:
        with printing:
            print(line, flush=True)

    count = int(n)
    if kind == "train":
        episodes = workloads.agentic_by_step(1)
        work = [("step", step) for step in range(count)]
    else:
        records = workloads.gsm8k(count)
        work = [("episode", i) for i in range(count)]

    def log(part: list[tuple[str, int]]) -> None:
        for what, index in part:
            if what == "step":
                run.log_episodes(episodes[index % 30])
                say(f"ok episode {episodes[index % 30][0]['id']}")
                run.log_metrics({"loss": 1.0 / (index + 1)}, step=index)
                say(f"ok metrics {index}")
            else:
                run.log_episodes([records[index]])
                say(f"ok episode {records[index]['id']}")

    parts = [work[t :: int(threads)] for t in range(int(threads))]
    workers = [threading.Thread(target=log, args=(part,)) for part in parts]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    say("logged all")
    sys.stdin.readline()
    if ending == "finish":
        run.finish(timeout=120)
    elif ending == "exception":
        try:
            with run:
                raise RuntimeError("the training loop failed")
        except RuntimeError:
            pass
    else:
        say("ready")
        # Wait for the signal (SIGTERM: the run's handler closes it; SIGKILL:
        # nothing does) in a loop of sleeps, not signal.pause() or sigwait():
        # the kernel may hand a SIGTERM to a native thread that does not block
        # it (pyarrow's, here with mask 0); CPython's C handler then only flags
        # it, the handler runs at the main thread's next bytecode, and a main
        # thread blocked in pause() never gets there (a trial hung so, 1 in
        # ~60). Each turn of this loop is such a bytecode.
        while True:
            time.sleep(1.0)
    say(f"finished {run.status.value} failed={run.failed_records} dropped={run.dropped_records}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
