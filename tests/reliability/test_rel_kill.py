"""Kill torture (issue #8 §1): a producer SIGKILLed during an append, while
requests are in flight, during finish(), or ``primeruns replay`` killed itself;
after a replay the platform holds exactly the journaled records, once each,
and every acknowledged record is among them. Seeded; a failure names its seed.

Longer campaign: ``python tools/torture/kill_torture.py --trials 200 --seed 0``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import rel_torture as rt

from primeruns.local import LocalPlatform


@pytest.mark.parametrize("seed", range(4))  # one per kill phase
def test_kill_at_a_random_point_then_replay_is_exactly_once(
    seed: int, shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    trial = rt.kill_trial(seed, tmp_path, shared_platform)
    assert trial.ok, trial.problems
    assert trial.records > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 24))
def test_kill_torture_long(seed: int, shared_platform: LocalPlatform, tmp_path: Path) -> None:
    trial = rt.kill_trial(seed, tmp_path, shared_platform)
    assert trial.ok, trial.problems
