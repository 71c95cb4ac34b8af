"""One end-to-end producer for ``end_to_end.py``, run as its own process.

``python e2e_worker.py SDK RECORDS URL RUNS_DIR`` opens an eval run with SDK
``ours`` (this SDK), ``threads`` (this SDK shipping from threads in the
producer, with the CPU time spent in its journal timed, see below) or
``vendor`` (``prime_runs`` 0.1.4, run with the vendor's own virtual
environment's python), logs every episode of the JSONL file
RECORDS with one ``log_episodes([episode])`` call each, finishes the run, and
prints one JSON line: wall and CPU seconds (all threads of this process) from
just before ``init`` to ``finish`` returning, the CPU seconds of its reaped
children (``child_cpu_s``: this SDK's uplink process, which ``finish()``
waits for, its start-up included; the vendor starts none), the run id, and
how long the SDK's ``import`` took (``import_s``). With ``E2E_WARM_RUN=1`` in
its environment it then opens, logs and finishes a second run the same way
and adds that run's ``warm_wall_s`` and ``warm_run_id``: the price of each
evaluation after the first in a sweep run from one process.

``threads`` is how ``end_to_end.py`` weighs the journal's own cost against the
same SDK without it: ``journal_cpu.install()`` wraps the real journal's entry
points (its methods, the functions the SDK calls, the mover and background
sync threads it starts), each span adding the thread CPU time spent inside it
(nested calls once), and the line adds ``journal_cpu_s`` (of ``cpu_s``), its
split by group of threads, the number of timed calls and what one timed call
costs. The SDK without its journal is then ``cpu_s - journal_cpu_s``. Shipping
from threads keeps all of the journal's work in this process; the uplink
process would take the mover and the shippers' reads out of it. This replaced
a hand-written in-memory copy of the journal's API, which drifted from the
journal (see ``journal_cpu``).

It imports only the standard library before choosing the SDK, so the vendor's
interpreter (which has no ``primeruns``) can run it too. Settings come from
the environment the driver sets (HOME, PRIME_TRACES_URL).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

API_KEY = "bench-key-0123456789"


def _init(sdk: str, url: str, runs_dir: str) -> Any:
    common: dict[str, Any] = {
        "name": f"bench-e2e-{sdk}",
        "environments": ["gsm8k"],
        "model": "Qwen/Qwen3-8B",
        "framework": "verifiers",
        "api_key": API_KEY,
        "base_url": url,
        "mode": "online",
    }
    if sdk == "vendor":
        import prime_runs

        return prime_runs.init(**common)
    if sdk == "threads":
        os.environ["PRIME_RUNS_UPLINK"] = "threads"
    import primeruns

    return primeruns.init(**common, runs_dir=runs_dir)


def main(argv: list[str]) -> int:
    sdk, records_path, url, runs_dir = argv
    with open(records_path, "rb") as f:
        episodes = [json.loads(line) for line in f if line.strip()]
    imported0 = time.perf_counter()
    if sdk == "vendor":
        import prime_runs  # noqa: F401  (imported before the clock starts, as ours is)
    else:
        import primeruns

        # ``import primeruns`` loads its public names on first use (PEP 562);
        # ``import prime_runs`` loads all of the vendor's at once. Looking
        # ``init`` up loads what it needs (the journal, the uplink's client):
        # both SDKs' modules are then loaded before the clock, as they are
        # in ``import_s`` after it.
        primeruns.init  # noqa: B018
    import_s = time.perf_counter() - imported0
    clock, per_call = None, 0.0
    if sdk == "threads":
        import journal_cpu

        clock = journal_cpu.install()
        per_call = journal_cpu.wrapper_cost()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = _init(sdk, url, runs_dir)
    for episode in episodes:
        run.log_episodes([episode])
    logged = time.perf_counter()
    run.finish()
    cpu1, wall1 = time.process_time(), time.perf_counter()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out: dict[str, Any] = {
        "sdk": sdk,
        "run_id": run.id,
        "episodes": len(episodes),
        "wall_s": wall1 - wall0,
        "cpu_s": cpu1 - cpu0,
        "child_cpu_s": children.ru_utime + children.ru_stime,
        "log_s": logged - wall0,
        "finish_s": wall1 - logged,
        "dropped": int(getattr(run, "dropped_records", 0) or 0),
        "import_s": import_s,
    }
    if os.environ.get("E2E_WARM_RUN") == "1":
        # The same run again in this process: what each evaluation of a sweep
        # pays once the first has loaded everything (imports, the first
        # connection's set-up, lazily loaded modules).
        warm0 = time.perf_counter()
        again = _init(sdk, url, runs_dir)
        for episode in episodes:
            again.log_episodes([episode])
        again.finish()
        out.update(warm_wall_s=time.perf_counter() - warm0, warm_run_id=again.id)
    if clock is not None:
        out.update(clock.report(), wrapper_cost_s=per_call)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
