"""One end-to-end producer for ``end_to_end.py``, run as its own process.

``python e2e_worker.py SDK RECORDS URL RUNS_DIR`` opens an eval run with SDK
``ours`` (this SDK), ``threads`` (this SDK shipping from threads in the
producer), ``memory`` (this SDK with the journal replaced by an in-memory
queue, see ``memjournal.py``, shipping from threads) or ``vendor``
(``prime_runs`` 0.1.4, run with the vendor's own virtual environment's
python), logs every episode of
the JSONL file RECORDS with one ``log_episodes([episode])`` call each, finishes
the run, and prints one JSON line: wall and CPU seconds (all threads of this
process) from just before ``init`` to ``finish`` returning, and the run id.

It imports only the standard library before choosing the SDK, so the vendor's
interpreter (which has no ``primeruns``) can run it too. Settings come from
the environment the driver sets (HOME, PRIME_TRACES_URL).
"""

from __future__ import annotations

import json
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
    if sdk in ("memory", "threads"):
        import os

        os.environ["PRIME_RUNS_UPLINK"] = "threads"
    if sdk == "memory":
        import memjournal

        memjournal.install()
    import primeruns

    return primeruns.init(**common, runs_dir=runs_dir)


def main(argv: list[str]) -> int:
    sdk, records_path, url, runs_dir = argv
    with open(records_path, "rb") as f:
        episodes = [json.loads(line) for line in f if line.strip()]
    if sdk == "vendor":
        import prime_runs  # noqa: F401  (imported before the clock starts, as ours is)
    else:
        import primeruns  # noqa: F401
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = _init(sdk, url, runs_dir)
    for episode in episodes:
        run.log_episodes([episode])
    logged = time.perf_counter()
    run.finish()
    cpu1, wall1 = time.process_time(), time.perf_counter()
    print(
        json.dumps(
            {
                "sdk": sdk,
                "run_id": run.id,
                "episodes": len(episodes),
                "wall_s": wall1 - wall0,
                "cpu_s": cpu1 - cpu0,
                "log_s": logged - wall0,
                "finish_s": wall1 - logged,
                "dropped": int(getattr(run, "dropped_records", 0) or 0),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
