"""The whole configuration matrix of ``tests/reliability/matrix.py``: every
configuration users run (threads, Prime Traces on / not enabled / opted out,
pyarrow, kind, faults, endings), each checked against the oracle, with one
results row for the README's reliability table.

    python tools/torture/matrix_torture.py [--only SUBSTRING] [--repeat N]

Exits 1 naming the failing configurations.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torture_common  # noqa: F401  (puts tests/ on the path)
from matrix import Outcome, Platforms, all_configs, run_trial


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", default="", help="configurations whose label contains this")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, with other seeds")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="torture-matrix-"))
    platforms = Platforms(work / "platforms")
    outcomes: list[Outcome] = []
    started = time.monotonic()
    try:
        configs = [c for c in all_configs() if args.only in c.label]
        for round_ in range(args.repeat):
            for index, config in enumerate(configs):
                seed = round_ * len(configs) + index
                outcome = run_trial(config, platforms, work / f"t{seed}", seed=seed)
                outcomes.append(outcome)
                if not outcome.ok:
                    print(f"FAIL {config.label} (seed {seed}): {outcome.problems}", flush=True)
    finally:
        platforms.stop()
    failed = [o for o in outcomes if not o.ok]
    records = sum(o.records for o in outcomes)
    ghosts = sum(o.ghosts for o in outcomes)
    print(
        f"matrix: {len(outcomes)} configurations, {records:,} records, "
        f"{len(failed)} failed, {ghosts} empty extra training run(s) where a create's "
        f"answer was lost, {time.monotonic() - started:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
