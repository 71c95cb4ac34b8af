"""``metrics.from_episodes``: the run summary, equal to the vendor's on the
golden episodes, and the same for objects and their mappings."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

import primeruns as pr
from primeruns.metrics import from_episodes

DATA = Path(__file__).resolve().parent / "data"


def golden(name: str) -> dict[str, Any]:
    raw = (DATA / f"golden_{name}.json.zst").read_bytes()
    loaded: dict[str, Any] = json.loads(zstandard.ZstdDecompressor().decompress(raw))
    return loaded


def same(actual: Any, expected: Any) -> bool:
    # NaN-aware: json.dumps writes NaN as NaN on both sides; key order counts too.
    return json.dumps(actual) == json.dumps(expected)


def test_summary_of_eval_mappings_equals_the_vendor_on_objects() -> None:
    case = golden("eval")
    summary = from_episodes(case["inputs"])
    assert same(summary, case["summary"])
    assert math.isnan(summary["avg_metrics"]["nan_metric"])  # no filtering here (§6.5)
    assert summary["avg_metrics"]["inf_metric"] == math.inf
    assert 0 < summary["avg_error"] < 1


def test_summary_of_training_mappings_equals_the_vendor_on_objects() -> None:
    case = golden("train")
    assert same(from_episodes(case["inputs"]), case["summary"])


# Duck-typed objects, as verifiers' Episode/Trace look to the SDK.


@dataclass
class Reward:
    score: float
    weight: float = 1.0


@dataclass
class Agent:
    trainable: bool = True


@dataclass
class Trace:
    rewards: dict[str, Reward | None] = field(default_factory=dict)
    metrics: dict[str, float | None] = field(default_factory=dict)
    agent: Agent = field(default_factory=Agent)

    @property
    def reward(self) -> float:
        return sum(r.score * r.weight for r in self.rewards.values() if r is not None)

    def as_record(self) -> dict[str, Any]:
        return {
            "agent": {"trainable": self.agent.trainable},
            "rewards": {
                name: None if r is None else {"score": r.score, "weight": r.weight}
                for name, r in self.rewards.items()
            },
            "metrics": dict(self.metrics),
        }


@dataclass
class Episode:
    traces: list[Trace]
    ok: bool = True

    def as_record(self) -> dict[str, Any]:
        return {"ok": self.ok, "traces": [trace.as_record() for trace in self.traces]}


EPISODES = [
    Episode(
        [
            Trace({"a": Reward(1.0, 2.0), "b": None}, {"m": 3.0, "a": 0.5}),
            Trace({"a": Reward(9.0)}, {"m": 100.0}, Agent(trainable=False)),
        ]
    ),
    Episode([Trace({"a": Reward(0.0)}, {"m": None, "n": 4.0})], ok=False),
    Episode([]),
]


def test_objects_and_their_mappings_give_the_same_summary() -> None:
    records = [episode.as_record() for episode in EPISODES]
    assert from_episodes(EPISODES) == from_episodes(records)
    mixed = [EPISODES[0], records[1], EPISODES[2]]
    assert from_episodes(mixed) == from_episodes(EPISODES)


def test_summary_follows_the_contract() -> None:
    summary = from_episodes(EPISODES)
    # Only the two trainable traces count; the judge's 9.0 and 100.0 do not.
    assert summary["avg_reward"] == (2.0 + 0.0) / 2
    # A metric overrides the reward of the same name; each name its own denominator.
    assert summary["avg_metrics"] == {"a": (0.5 + 0.0) / 2, "m": 3.0, "n": 4.0}
    assert summary["avg_error"] == 1 / 3


def test_with_no_trainable_trace_every_trace_counts() -> None:
    traces = [
        Trace({"a": Reward(1.0)}, agent=Agent(False)),
        Trace({"a": Reward(3.0)}, agent=Agent(False)),
    ]
    assert from_episodes([Episode(traces)])["avg_reward"] == 2.0


def test_explicit_traces_replace_the_episodes_traces() -> None:
    only = [Trace({"a": Reward(5.0)})]
    summary = from_episodes(EPISODES, traces=only)
    assert summary["avg_reward"] == 5.0
    assert summary["avg_error"] == 1 / 3  # still over the episodes


def test_empty_input_gives_zeros() -> None:
    assert from_episodes([]) == {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0}
    assert from_episodes([{"ok": True, "traces": []}])["avg_reward"] == 0.0


def test_mapping_reward_weight_defaults_to_one() -> None:
    record = {"ok": True, "traces": [{"rewards": {"a": {"score": 0.75}, "b": None}}]}
    assert from_episodes([record])["avg_reward"] == 0.75


def test_the_vendor_names_reach_it() -> None:
    assert pr.metrics.from_episodes is from_episodes
