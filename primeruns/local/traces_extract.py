"""Summary columns of one trace or episode document (inferred: the service's
clients do not say how it derives them).

The service indexes a handful of columns per trace; these are this emulator's
choices for where each comes from:

- ``run_id``/``step``: the trace's OWN ``run.id`` / ``run.work.step`` (never the
  envelope's: that is why producers stamp member traces).
- ``created_at``: ``timing.start``; ``duration_ms``: the latest ``end`` of any
  timing phase minus the start.
- ``model.id``: ``agent.config.model``; ``model.provider``:
  ``agent.config.provider`` or the host of ``agent.config.client.base_url``.
- ``score.reward``: sum of ``score * weight`` over non-null rewards (null when
  none is scored); ``score.outcome``: ``stop_condition``.
- ``execution.has_error``: ``ok`` is false or ``errors`` is non-empty;
  ``is_truncated``: an ``is_truncated`` flag or a call with ``finish_reason`` "length".
- ``task_id``: ``task.data.id``, else ``task.data.name``, else ``task.key``.
- ``total_tokens``: ``num_total_tokens``; ``environment_id``: the episode's ``env.id``.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlparse

from ..jsonbound import finite_number
from .queries import is_64_bit


def as_object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (documents are untrusted)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


#: A document's number as a finite float, or None: an integer past the
#: floats (JSON bounds no number's digits, and ``json`` reads what orjson
#: cannot) is none, not an OverflowError (a 500).
number = finite_number


def is_number(value: Any) -> bool:
    return number(value) is not None


def reward_of(doc: dict[str, Any]) -> float | None:
    total: float | None = None
    for entry in as_object(doc.get("rewards")).values():
        entry = as_object(entry)
        score = number(entry.get("score"))
        if score is None:
            continue
        weight = number(entry.get("weight", 1.0))
        total = (total or 0.0) + score * (1.0 if weight is None else weight)
    # Finite scores may sum past the floats (1e308 * 10): an infinite reward,
    # stored, made every read of the traces' rows a 500, the runs' list
    # included. Such a sum is no reward, as none scored is.
    return total if total is None or math.isfinite(total) else None


def duration_ms(timing: dict[str, Any]) -> int:
    start = number(timing.get("start"))
    ends = [
        e
        for p in timing.values()
        if isinstance(p, dict) and (e := number(p.get("end"))) is not None
    ]
    if start is None or not ends:
        return 0
    # Its column is a 64-bit integer: an end past that (1e308, 2**64) was an
    # OverflowError in round() or the insert, a 500 for every upload holding
    # the trace; such a duration is none, as a trace without an end has.
    duration = (max(ends) - start) * 1000
    return max(0, round(duration)) if is_64_bit_float(duration) else 0


def has_error(doc: dict[str, Any]) -> bool:
    errors = doc.get("errors")
    return doc.get("ok") is False or (isinstance(errors, list) and len(errors) > 0)


def first_error(doc: dict[str, Any]) -> tuple[str | None, str | None]:
    errors = doc.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        return _str(errors[0].get("type")), _str(errors[0].get("message"))
    return None, None


def is_64_bit_float(value: float) -> bool:
    """Whether ``value`` rounds to an integer SQLite holds (64 bits, signed)."""
    return -(2.0**63) <= value < 2.0**63


def is_64_bit_int(value: Any) -> bool:
    """Whether ``value`` is a JSON integer (not a bool) SQLite holds."""
    return isinstance(value, int) and not isinstance(value, bool) and is_64_bit(value)


def step_of(run: dict[str, Any]) -> int | None:
    """The trace's step for its indexed column: an int SQLite holds (64
    bits, signed), else None. A step past that range was an OverflowError
    in the insert, a 500 answered to every upload holding the trace, so an
    older SDK's journal holding one stalled its traces for good; the trace
    is stored whole, its step in its document."""
    step = as_object(run.get("work")).get("step")
    return step if is_64_bit_int(step) else None


def trace_columns(doc: dict[str, Any], environment_id: str | None) -> dict[str, Any]:
    """The indexed columns of one (already validated) trace document."""
    run = as_object(doc.get("run"))
    agent = as_object(doc.get("agent"))
    config = as_object(agent.get("config"))
    task = as_object(doc.get("task"))
    data = as_object(task.get("data"))
    timing = as_object(doc.get("timing"))
    provider = _str(config.get("provider"))
    base_url = _str(as_object(config.get("client")).get("base_url"))
    if provider is None and base_url is not None:
        provider = urlparse(base_url).hostname
    task_id = data.get("id") or data.get("name") or task.get("key")
    calls_value = doc.get("calls")
    calls: list[Any] = calls_value if isinstance(calls_value, list) else []
    truncated = doc.get("is_truncated") is True or any(
        isinstance(c, dict) and c.get("finish_reason") == "length" for c in calls
    )
    tokens = doc.get("num_total_tokens")
    return {
        "trace_id": doc["id"],
        "run_id": _str(run.get("id")),
        "run_type": _str(run.get("type")),
        "run_name": _str(run.get("name")),
        "step": step_of(run),
        "environment_id": environment_id,
        "model_id": _str(config.get("model")),
        "model_provider": provider,
        "task_id": None if task_id is None else str(task_id),
        "agent_name": _str(agent.get("name")),
        "reward": reward_of(doc),
        "outcome": _str(doc.get("stop_condition")),
        "has_error": has_error(doc),
        "is_truncated": truncated,
        "duration_ms": duration_ms(timing),
        # Past 64 bits, as not an integer: 0 (the insert's OverflowError was a 500).
        "total_tokens": tokens if is_64_bit_int(tokens) else 0,
        "created_at": float(timing["start"]),
    }
