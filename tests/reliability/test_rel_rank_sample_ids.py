"""Ranks of one training run number their sample rows apart, however many
Parquet objects a rank makes of one step.

Each object of a step takes a ``sample_id`` range of its own (``<< 32``),
and rank N draws a step's ranges from a block of its own
(``ship.uplink._range_base``). A rank makes an object of a step per run of
that step's episodes in what it ships: one per call of an asynchronous
trainer that logs each rollout as it comes and ships it before the next,
or, as here, one per episode when rollouts of two steps arrive interleaved.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import fork_oracle as fo
import httpx
import pyarrow.parquet as pq
import pytest
import rel_torture as rt
import workloads

import primeruns as pr
from primeruns.local import LocalPlatform
from primeruns.local.objects import object_path

# More objects of one step than the block of ranges a rank has per step (256).
_OBJECTS = 260


def _create(lp: LocalPlatform) -> str:
    """The run, created as a launcher does before it starts the ranks."""
    body = {"base_model": "m", "max_steps": 100, "environments": [], "team_id": fo.TEAM}
    made = httpx.post(
        f"{lp.url}/api/v1/rft/external-runs",
        json=body,
        headers={"Authorization": f"Bearer {rt.KEY}"},
    )
    return str(made.json()["run"]["id"])


def _rank(lp: LocalPlatform, runs_dir: Path, run_id: str) -> pr.Run:
    return pr.init(
        kind="train", id=run_id, model="m", api_key=rt.KEY, base_url=lp.url, runs_dir=runs_dir
    )


# ~1 min: 520 objects through the platform (``tests/sinks/test_step_ranges.py``
# holds the rule in the default suite).
@pytest.mark.slow
def test_a_rank_making_more_objects_of_a_step_than_its_block_collides_with_no_other_rank(
    train_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = train_platform
    by_step = workloads.agentic_by_step(_OBJECTS + 1)
    interleaved = [e for pair in zip(by_step[0], by_step[10], strict=True) for e in pair]
    run_id = _create(lp)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        # Both ranks attached at once, as a launcher starts them.
        monkeypatch.setenv("RANK", "0")
        rank0 = _rank(lp, tmp_path / "runs", run_id)
        monkeypatch.setenv("RANK", "1")
        rank1 = _rank(lp, tmp_path / "runs", run_id)
        rank1.log_episodes(by_step[0][_OBJECTS:])  # one object of step 0
        rank1.finish(timeout=120)
        for k in range(0, 2 * _OBJECTS, 40):  # an object per episode
            rank0.log_episodes(interleaved[k : k + 40])
        rank0.finish(timeout=300)
    stored = lp.run(run_id)
    assert stored["status"] == "COMPLETED"
    ids: Counter[tuple[int, int]] = Counter()
    for obj in stored["parquet_objects"]:
        table = pq.read_table(object_path(lp.data_dir / "objects", obj["key"]))
        ids.update((obj["step"], i) for i in table.column("sample_id").to_pylist())
    assert sum(ids.values()) == 2 * _OBJECTS + 1
    assert [key for key, n in ids.items() if n > 1] == []
