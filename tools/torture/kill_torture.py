"""Kill torture: SIGKILL a producer of a mixed eval/training workload at seeded
random points (during an append, with requests in flight, during finish(), or
kill ``primeruns replay`` itself), replay, and check the platform holds exactly
the journaled records once each, every acknowledged record among them.

    python tools/torture/kill_torture.py --trials 200 --seed 0

Prints one row per trial and a results row; exits 1 naming the failing seeds
(rerun one with ``--trials 1 --seed N``).
"""

from __future__ import annotations

import sys

import torture_common as tc


def main() -> int:
    args = tc.parse(__doc__ or "")
    return tc.run_trials("kill", tc.rt.kill_trial, args)


if __name__ == "__main__":
    sys.exit(main())
