"""One of two processes attaching to the same training run id at once.

Usage: python rel_attacher.py RUNS_DIR BASE_URL RUN_ID TAG PARITY N
Logs N small episodes ``TAG-i`` and metrics rows at steps with the given
parity, then finishes; prints ``finished`` at the end.
"""

from __future__ import annotations

import sys

import primeruns as pr


def main() -> None:
    runs_dir, base_url, run_id, tag = sys.argv[1:5]
    parity, n = int(sys.argv[5]), int(sys.argv[6])
    run = pr.init(
        kind="train",
        id=run_id,
        model="m",
        team_id="team-a",
        api_key="test-key-0123456789",
        base_url=base_url,
        runs_dir=runs_dir,
    )
    for i in range(n):
        run.log_episodes(
            [{"id": f"{tag}-{i}", "traces": [], "run": {"work": {"step": 2 * i + parity}}}]
        )
        run.log_metrics({"loss": 1.0 / (i + 1)}, step=2 * i + parity)
    run.finish(timeout=120)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
