"""Network chaos: runs against ``primeruns serve`` under seeded retryable
failures, ambiguous failures (committed, response lost), latency spikes, the
platform down a while and back, 429 storms with a long Retry-After, and all of
them mixed; each run must land exactly once with a COMPLETED status.

    python tools/torture/chaos_torture.py --trials 60 --seed 0

Prints one row per trial and a results row; exits 1 naming the failing seeds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torture_common as tc

from primeruns.local import LocalPlatform


def trial(seed: int, work: Path, lp: LocalPlatform) -> tc.Trial:
    return tc.rt.chaos_trial(seed, work, lp, n=150)


def main() -> int:
    args = tc.parse(__doc__ or "")
    return tc.run_trials("chaos", trial, args)


if __name__ == "__main__":
    sys.exit(main())
