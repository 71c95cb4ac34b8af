"""A sample's row of an evaluation's table (:class:`~.views.SampleRow`), from what a source holds.

The table, its sort and filters and the analysis read only these few
fields, so both sources make them the same way: from a v0 sample row (the
platform's stored body, or a journal's episode projected), or, for a
journal, straight from the episode record (:func:`record_row`), which is
what the projection would give without building the whole v0 row: the
messages of every branch and a serialisation of the row to size it were
most of an offline analysis' time.

- **Tokens** are the episode's own counts (``num_input_tokens``,
  ``num_output_tokens``: verifiers computes them over every trace, counting
  re-sent context once, as the platform's ``total_tokens`` does); a row
  without its episode (a v0 row posted as such, or one trace's row of an
  oversized episode) falls back on its ``token_usage`` (prompt tokens,
  cached ones included, and completion tokens).
- **The error** is the summary trace's last (the v0 row's ``error``), else
  the episode's own last (``errors`` of the record), as the episode page
  shows it; its **category** is what kind of error it is: its type (the
  exception's class, ``ToolTimeout``), or, for an error that names none,
  its text's first line.

Documents are user content: every field is checked for its type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ...projection import trace_reward
from ..traces_extract import as_list, as_object, number
from .views import SampleRow, sample_row_of

#: The longest category kept (an error's first line can be anything).
MAX_CATEGORY_CHARS = 80
#: An error text's head that names its kind (``TimeoutError: ...``, ``vf.ParseError: ...``).
_KIND = re.compile(r"([A-Za-z_][\w.]{0,79}): ")


def error_text(value: Any) -> str | None:
    """An error object (``{type, message}``) or string as one line of text."""
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    error = as_object(value)
    kind, message = error.get("type") or error.get("error_type"), error.get("message")
    if kind or message:
        return ": ".join(str(v) for v in (kind, message) if v)
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (ValueError, TypeError, RecursionError):  # nested past what json writes
        return "an error too deeply nested to show"


def error_category(text: str | None) -> str | None:
    """The kind of error ``text`` (as :func:`error_text` writes it) is: the type
    it starts with, else its first line, cut to ``MAX_CATEGORY_CHARS``."""
    if not text:
        return None
    named = _KIND.match(text)
    if named:
        return named.group(1)
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= MAX_CATEGORY_CHARS else line[: MAX_CATEGORY_CHARS - 1] + "…"


#: Counts from here up are not believed (and would not fit SQLite's integers).
MAX_COUNT = 1 << 53


def _count(value: Any) -> int | None:
    """A token count: a non-negative JSON integer (not a bool) below ``MAX_COUNT``, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
        return None
    return value


def token_counts(
    episode: Mapping[str, Any], usage: Mapping[str, Any]
) -> tuple[int | None, int | None]:
    """(input, output) tokens: the ``episode`` record's counts, else ``usage``'s
    (a v0 row's ``token_usage``: prompt plus cached input tokens, completion tokens)."""
    read, written = (
        _count(episode.get("num_input_tokens")),
        _count(episode.get("num_output_tokens")),
    )
    if read is not None or written is not None:
        return read, written
    prompt, cached = _count(usage.get("prompt_tokens")), _count(usage.get("cached_input_tokens"))
    written = _count(usage.get("completion_tokens"))
    return (None if prompt is None else prompt + (cached or 0)), written


def _trainable(trace: dict[str, Any]) -> bool:
    # As the projection reads it: verifiers' AgentInfo.trainable defaults to True.
    return bool(as_object(trace.get("agent")).get("trainable", True))


def _last(values: Any) -> Any:
    errors = as_list(values)
    return errors[-1] if errors else None


def sample_row(index: int, body: dict[str, Any]) -> SampleRow:
    """A v0 sample row as one line of an evaluation's samples table."""
    task = as_object(body.get("task"))
    label = task.get("id") or task.get("name") or body.get("example_id")
    sample_id = body.get("sample_id")
    episode = as_object(as_object(body.get("info")).get("native_wrapper"))
    error = error_text(body.get("error")) or error_text(_last(episode.get("errors")))
    read, written = token_counts(episode, as_object(body.get("token_usage")))
    return SampleRow(
        index=index,
        sample_id=None if sample_id is None else str(sample_id),
        reward=number(body.get("reward")),
        error=error,
        task=None if label is None else str(label),
        input_tokens=read,
        output_tokens=written,
        category=error_category(error),
    )


def record_row(index: int, record: dict[str, Any]) -> SampleRow | None:
    """An episode record's row, as ``sample_row`` of its projection would be,
    without projecting it; None for what is not a plain ``to_record()``
    episode (a v0 row, no traces, a trace or errors not of verifiers' shape,
    no token counts of its own): those are left to the projection, which says
    what is wrong or reads the calls' usage."""
    traces = record.get("traces")
    if "sample_id" in record or not isinstance(traces, list) or not traces:
        return None
    if not all(isinstance(t, dict) for t in traces):
        return None
    read, written = token_counts(record, {})
    if read is None and written is None:
        return None
    # The summary trace (``projection.summary_trace_index``): the first trainable.
    summary = next((t for t in traces if _trainable(t)), traces[0])
    if not isinstance(summary.get("errors") or [], list):
        return None
    try:
        reward = number(trace_reward(summary))
    except (TypeError, KeyError, AttributeError, ValueError, OverflowError):
        # OverflowError: a score past the floats (JSON bounds no integer's digits).
        return None
    task = as_object(as_object(summary.get("task")).get("data"))
    label = task.get("id") or task.get("name") or task.get("idx")
    last = _last(summary.get("errors"))
    if isinstance(last, dict):  # the projection drops its null fields
        last = {k: v for k, v in last.items() if v is not None}
    error = error_text(last) or error_text(_last(record.get("errors")))
    episode_id = record.get("id")
    return sample_row_of(
        index,
        None if episode_id is None else str(episode_id),
        reward,
        error,
        None if label is None else str(label),
        read,
        written,
        error_category(error),
    )
