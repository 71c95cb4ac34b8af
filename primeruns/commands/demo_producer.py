"""The producer ``primeruns demo`` kills: an eval run logging the demo episodes
one at a time, printing each id once its ``log_episodes`` call returned.

Run as ``python -m primeruns.commands.demo_producer RUNS_DIR BASE_URL``; the
API key comes from ``PRIME_API_KEY`` in its environment (never argv). Each
episode stands for real work (a model call), simulated by a short pause, so
the parent can kill it genuinely mid-run.
"""

from __future__ import annotations

import sys
import time

import primeruns as pr

from .demo_data import eval_episodes

WORK_S = 0.03  # simulated model time per episode


def main() -> None:
    runs_dir, base_url = sys.argv[1], sys.argv[2]
    run = pr.init(
        name="demo-gsm8k-killed",
        environments=["gsm8k"],
        model="Qwen/Qwen3-8B",
        framework="verifiers",
        mode="online",
        base_url=base_url,
        runs_dir=runs_dir,
        traces_opt_out=False,
    )
    print(f"journal {run.journal_path}", flush=True)
    print(f"run {run.id}", flush=True)
    for episode in eval_episodes():
        time.sleep(WORK_S)
        run.log_episodes([episode])
        print(f"logged {episode['id']}", flush=True)
    run.finish()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
