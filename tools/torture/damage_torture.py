"""Damaged journals: flip 1-16 random bits of a finished journal's copy per
trial and ship it with ``primeruns replay``'s code: nothing may raise except a
JournalError that says why, and every record that still reads intact lands
exactly once (or the shortfall is reported).

    python tools/torture/damage_torture.py --trials 300 --seed 0

Prints one row per trial and a results row; exits 1 naming the failing seeds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torture_common as tc

from primeruns.local import LocalPlatform

_CLEAN: dict[str, Path] = {}


def trial(seed: int, work: Path, lp: LocalPlatform) -> tc.Trial:
    import rel_damage as rd

    if "path" not in _CLEAN:  # one clean journal, damaged afresh by every trial
        _CLEAN["path"], _ = rd.offline_journal(work.parent / "clean")
    work.mkdir(parents=True, exist_ok=True)
    return rd.damage_trial(seed, _CLEAN["path"], work, lp)


def main() -> int:
    args = tc.parse(__doc__ or "")
    return tc.run_trials("damage", trial, args)


if __name__ == "__main__":
    sys.exit(main())
