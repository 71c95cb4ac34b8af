"""A producer for kill torture: logs an eval or training workload in batches
of 1-7 records and prints one line per record once the ``log_*`` call holding
it returned (flushed), so its killer knows exactly what the SDK accepted.

Usage: python rel_producer.py RUNS_DIR eval|train N [BASE_URL]
Without BASE_URL the run is offline. Output lines: ``journal PATH``, then
``episode ID`` / ``metrics STEP`` per record, ``logged all``, ``finished``.
"""

from __future__ import annotations

import random
import sys

import workloads

import primeruns as pr

KEY = "test-key-0123456789"


def main() -> None:
    runs_dir, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    base_url = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
    common: dict[str, object] = {"runs_dir": runs_dir, "api_key": KEY}
    common.update(mode="online", base_url=base_url) if base_url else common.update(mode="offline")
    if kind == "train":
        run = pr.init(kind="train", model="m", team_id="team-a", **common)  # type: ignore[arg-type]
        records = workloads.agentic(n)
    else:
        run = pr.init(environments=["gsm8k"], model="m", **common)  # type: ignore[arg-type]
        records = workloads.gsm8k(n)
    print(f"journal {run.journal_path}", flush=True)
    rng = random.Random(n)
    index = 0
    while index < len(records):
        batch = records[index : index + rng.randint(1, 7)]
        run.log_episodes(batch)
        print("\n".join(f"episode {r['id']}" for r in batch), flush=True)
        if kind == "train":
            run.log_metrics({"loss": 1.0 / (index + 1)}, step=index)
            print(f"metrics {index}", flush=True)
        index += len(batch)
    print("logged all", flush=True)
    run.finish(timeout=120)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
