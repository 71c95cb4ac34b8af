"""Run-level aggregates over episodes, in the shape the eval dashboard reads.

``from_episodes`` is the aggregation verifiers used, so runs that
move to this SDK keep their numbers. It reads episodes and traces duck-typed:
verifiers objects through their attributes (``trace.reward`` included) and
mappings of the ``to_record()`` shape through their keys, giving the same result
for an object and its record. Pass the result to ``run.finish(summary=...)``.

No filtering happens here: a NaN metric propagates into its average, and the
summary cleaning of ``finish()`` then drops it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

__all__ = ["RunSummary", "from_episodes"]


class RunSummary(TypedDict):
    """``avg_reward`` and ``avg_metrics`` over the scored traces, ``avg_error``
    the share of episodes that are not ok."""

    avg_reward: float
    avg_metrics: dict[str, float]
    avg_error: float


_MISSING: Any = object()


def _field(obj: Any, name: str, default: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _trainable(trace: Any) -> bool:
    # verifiers' AgentInfo.trainable defaults to True.
    return bool(_field(_field(trace, "agent", None), "trainable", True))


def _score(reward: Any) -> Any:
    return reward["score"] if isinstance(reward, Mapping) else reward.score


def _reward(trace: Any, rewards: Mapping[str, Any]) -> Any:
    """``Trace.reward``: the object's own property when it has one, else the
    sum of ``score * weight`` (weight 1.0 by default) over non-null rewards;
    no rewards gives 0, as verifiers' ``sum()`` does."""
    if not isinstance(trace, Mapping):
        value = getattr(trace, "reward", _MISSING)
        if value is not _MISSING:
            return value
    total: Any = 0
    for reward in rewards.values():
        if reward is None:
            continue
        weight = _field(reward, "weight", 1.0)
        total += _score(reward) * weight
    return total


def from_episodes(episodes: Sequence[Any], traces: Sequence[Any] | None = None) -> RunSummary:
    """Average rewards and metrics over the trainable traces (all traces when
    none is trainable: a judge or a simulated user would dilute every mean with
    structural zeros), and the share of episodes that are not ok.

    ``traces`` replaces the traces of ``episodes`` when given. Each metric name
    has its own denominator (the traces where it is not None); within a trace a
    metric overrides a reward score of the same name. Episodes and traces may
    be objects or mappings, mixed. An episode mapping without ``ok`` counts as
    not ok (verifiers' default).
    """
    if traces is None:
        traces = [trace for episode in episodes for trace in _field(episode, "traces", None) or ()]
    scored = [trace for trace in traces if _trainable(trace)] or list(traces)

    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    reward_total: Any = 0
    for trace in scored:
        rewards = _field(trace, "rewards", None) or {}
        values = {name: _score(reward) for name, reward in rewards.items() if reward is not None}
        metrics = _field(trace, "metrics", None) or {}
        values.update({name: value for name, value in metrics.items() if value is not None})
        for name, value in values.items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
        reward_total += _reward(trace, rewards)

    not_ok = sum(not _field(episode, "ok", False) for episode in episodes)
    return {
        "avg_reward": reward_total / len(scored) if scored else 0.0,
        "avg_metrics": {name: sums[name] / counts[name] for name in sums},
        "avg_error": not_ok / len(episodes) if episodes else 0.0,
    }
