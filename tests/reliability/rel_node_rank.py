"""One rank of a training run on a compute node with no route to the
platform (issue #29, ranks on several nodes).

Usage: python rel_node_rank.py RUNS_DIR BASE_URL RUN_ID RANK STEPS HOST

An offline run attached to RUN_ID, reporting HOST as its machine's name (as
a node of its own would, beside the login node the test syncs from), with
the launcher's ``RANK`` set by the test. Each step it logs this rank's
episodes and one metrics row with a key of its own (``loss_r<rank>``) and
one every rank logs (``lr``), printing ``episode <id>`` and ``metrics
<step>`` after each call returned; then it finishes and prints ``finished``.
"""

from __future__ import annotations

import socket
import sys

from rel_rank import episodes_of

import primeruns as pr


def main() -> None:
    runs_dir, base_url, run_id = sys.argv[1:4]
    rank, steps, host = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    socket.gethostname = lambda: host  # type: ignore[assignment]
    run = pr.init(
        kind="train",
        id=run_id,
        model="m",
        api_key="test-key-0123456789",
        base_url=base_url,
        runs_dir=runs_dir,
        mode="offline",
    )
    print("journal", run.journal_path, flush=True)
    for step, batch in episodes_of("train", rank, steps).items():
        run.log_episodes(batch)
        for episode in batch:
            print("episode", episode["id"], flush=True)
        run.log_metrics({f"loss_r{rank}": 1.0 / (step + 1), "lr": 0.1}, step=step)
        print("metrics", step, flush=True)
    run.finish(timeout=60)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
