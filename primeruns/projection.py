"""Episodes onto the platform's legacy sample tables.

Two projections live here, under the vendor's public names so that
``import prime_runs.projection`` keeps working:

- the v0 evaluation sample row (``build_samples``, ``batch_samples``): one row per
  episode, normally, posted to ``/evaluations/{id}/samples`` in 25 MiB requests;
- the training viewer's Parquet table (``episodes_to_parquet_bytes``): one object
  per step upload.

Why this is not the vendor's code: the vendor projects verifiers *objects*
through their computed properties. This SDK journals every record as its JSON
mapping and ships from the journal, so the projection works on **mappings of the
``Episode.to_record()`` shape** and re-derives those properties (``reward``,
``branches``, ``usage``, ``last_error``, ``is_truncated``...) from the fields
the mapping holds. Objects with ``to_record()`` are first turned into that
mapping, so an object and its mapping give identical rows (the golden fixtures
under ``tests/data`` hold both sides to the vendor's output).

Where a hand-made mapping differs from a ``to_record()`` one: ``None``-valued
keys are dropped at the top level of task data, messages, tool calls, content
parts, tools and errors (``to_record()`` has none there); deeper ``None`` values
are kept as pydantic keeps them inside free-form dicts. A trace without
``timing`` gets ``{}``.

pyarrow is imported only by the Parquet functions (the ``train`` extra).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

import orjson

from primeruns.logs import get_logger

from .records import encode_json, to_mapping

if TYPE_CHECKING:
    import pyarrow

__all__ = [
    "ENVELOPE_BYTES",
    "MAX_SAMPLES_PAYLOAD_BYTES",
    "SampleRows",
    "batch_samples",
    "build_samples",
    "episode_to_samples",
    "episodes_to_parquet_bytes",
    "json_bytes",
    "numbered_rows",
    "parquet_available",
    "record_to_samples",
    "sample_rows",
    "summary_trace_index",
    "trace_to_sample",
    "train_sample_schema",
]

logger = get_logger(__name__)

#: The platform's per-request ceiling on ``POST /evaluations/{id}/samples``.
MAX_SAMPLES_PAYLOAD_BYTES = 25 * 1024 * 1024
#: ``{"samples":[]}``: what a request costs before its first row.
ENVELOPE_BYTES = len(b'{"samples":[]}')

# Stop conditions verifiers counts as a truncation (``Trace.is_truncated``).
_TRUNCATING_STOPS = frozenset(
    {
        "max_turns",
        "max_input_tokens",
        "max_output_tokens",
        "max_total_tokens",
        "compaction_failed",
    }
)


def json_bytes(value: Any) -> int:
    """Size of ``value`` as compact UTF-8 JSON, as ``encode_json`` sends it.

    Sizing runs on every row, so the common all-builtin case is measured with a
    bare ``orjson.dumps``; anything it cannot encode takes ``encode_json``,
    which also refuses NaN with the field named.
    """
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return len(encode_json(value))


# --------------------------------------------------------------------------- helpers


_LEAVES = frozenset({str, int, bool, type(None)})


def nullify_non_finite(value: Any) -> Any:
    """A copy with NaN and infinity as ``None``: the tables show them as null
    rather than losing the row they sit in.

    It copies every row's whole native record, so plain dicts, lists and
    leaves are taken on exact-type checks before the general ones.
    """
    kind = type(value)
    if kind is dict:
        return {
            key: item if type(item) in _LEAVES else nullify_non_finite(item)
            for key, item in value.items()
        }
    if kind is list:
        return [item if type(item) in _LEAVES else nullify_non_finite(item) for item in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: nullify_non_finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [nullify_non_finite(item) for item in value]
    return value


# The viewer's text columns: ``json.dumps(value, allow_nan=False)``, its
# default separators and all. One encoder for every column of every row:
# ``json.dumps`` with an argument builds a new one per call (six a row).
# Without the circular check (the same text; ~8% less of its CPU, a set
# entry per container): a record that holds itself still fails, as
# RecursionError, which the null-ing copy's retry raised for it anyway.
_VIEWER_JSON = json.JSONEncoder(allow_nan=False, check_circular=False)


def _json_column(value: Any) -> str:
    # Encoded as it is first: a value holds a NaN or infinity rarely, and the
    # copy that nulls them walked every value of the trajectory (a third of
    # a sync's Parquet object). Only a refusal (one there; a mapping json
    # does not take) pays for the copy.
    try:
        return _VIEWER_JSON.encode(value)
    except (ValueError, TypeError):
        return _VIEWER_JSON.encode(nullify_non_finite(value))


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, a dict (what JSON parses to) told
    without the ABC's check: a replay of 20,000 episodes made 600,000 of
    them, a tenth of the projection's time."""
    return type(value) is dict or isinstance(value, Mapping)


def _without_none(value: Any) -> Any:
    """A mapping's top-level ``None`` values dropped (pydantic's
    ``exclude_none`` at the level of one model)."""
    if not _is_mapping(value):
        return value
    return {key: item for key, item in value.items() if item is not None}


def _message(message: Any) -> Any:
    """A message as ``Message.model_dump(mode="json", exclude_none=True)``."""
    if not _is_mapping(message):
        return message
    dumped = _without_none(message)
    content = dumped.get("content")
    if isinstance(content, list):
        dumped["content"] = [_without_none(part) for part in content]
    tool_calls = dumped.get("tool_calls")
    if isinstance(tool_calls, list):
        dumped["tool_calls"] = [_without_none(call) for call in tool_calls]
    return dumped


def _as_mapping(obj: Any, what: str) -> Mapping[str, Any]:
    return obj if _is_mapping(obj) else to_mapping(obj, what=what)


def _traces(episode: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    members = episode.get("traces") or []
    return [
        trace if type(trace) is dict else _as_mapping(trace, f"traces[{i}]")
        for i, trace in enumerate(members)
    ]


def _agent(trace: Mapping[str, Any]) -> Mapping[str, Any]:
    agent = trace.get("agent")
    return agent if _is_mapping(agent) else {}


def _trainable(trace: Mapping[str, Any]) -> bool:
    # verifiers' AgentInfo.trainable defaults to True.
    return bool(_agent(trace).get("trainable", True))


def _task_data(trace: Mapping[str, Any]) -> Mapping[str, Any]:
    task = trace.get("task")
    data = task.get("data") if _is_mapping(task) else None
    return data if _is_mapping(data) else {}


def trace_reward(trace: Mapping[str, Any]) -> float:
    """``Trace.reward``: the sum of ``score * weight`` over the non-null rewards
    (``weight`` defaults to 1.0). No rewards gives the int ``0``, as verifiers'
    ``sum()`` does."""
    rewards = trace.get("rewards") or {}
    total: float = sum(
        reward["score"] * reward.get("weight", 1.0)
        for reward in rewards.values()
        if reward is not None
    )
    return total


def _usages(calls: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [call["usage"] for call in calls if call.get("usage") is not None]


def _aggregate_usage(usages: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``Usage.aggregate`` dumped with ``exclude_none``: the optional counters
    sum over the responses that report them and are absent when none does."""
    if not usages:
        return None
    total: dict[str, Any] = {
        "prompt_tokens": sum(usage["prompt_tokens"] for usage in usages),
        "completion_tokens": sum(usage["completion_tokens"] for usage in usages),
    }
    for name in ("cached_input_tokens", "reasoning_tokens", "cost"):
        reported = [usage[name] for usage in usages if usage.get(name) is not None]
        if reported:
            total[name] = sum(reported)
    return total


def _new_input_tokens(calls: Sequence[Mapping[str, Any]]) -> int:
    """``Branch.num_input_tokens``: each call's prompt beyond the previous call's
    whole sequence, clamped at zero (verifiers' ``min_new_input_tokens``)."""
    total = 0
    previous = 0
    for usage in _usages(calls):
        input_tokens = usage["prompt_tokens"] + (usage.get("cached_input_tokens") or 0)
        total += max(0, input_tokens - previous)
        previous = input_tokens + usage["completion_tokens"]
    return total


def _branches(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``Trace.branches``: one root-to-leaf path per node that is no node's
    parent, as ``{messages, num_input_tokens, num_output_tokens}``."""
    nodes = trace.get("nodes") or []
    by_node = {
        call["node"]: call for call in trace.get("calls") or [] if call.get("node") is not None
    }
    has_child = {node.get("parent") for node in nodes if node.get("parent") is not None}
    branches: list[dict[str, Any]] = []
    for leaf in range(len(nodes)):
        if leaf in has_child:
            continue
        path: list[int] = []
        current: Any = leaf
        # A malformed parent (a cycle, an index out of range) ends the walk
        # instead of looping or raising: the row still shows what is there.
        while isinstance(current, int) and 0 <= current < len(nodes) and current not in path:
            path.append(current)
            current = nodes[current].get("parent")
        path.reverse()
        calls = [by_node[index] for index in path if index in by_node]
        branches.append(
            {
                "messages": [_message(nodes[index].get("message")) for index in path],
                "num_input_tokens": _new_input_tokens(calls),
                "num_output_tokens": sum(usage["completion_tokens"] for usage in _usages(calls)),
            }
        )
    return branches


def _is_truncated(trace: Mapping[str, Any]) -> bool:
    if trace.get("stop_condition") in _TRUNCATING_STOPS:
        return True
    calls = trace.get("calls") or []
    last = next((call for call in reversed(calls) if call.get("error") is None), None)
    return bool(last and last.get("finish_reason") == "length")


# --------------------------------------------------------------------------- v0 rows


def summary_trace_index(episode: Any) -> int:
    """The first trainable trace, else 0: the trace whose projection (and
    ``task.data.idx``) stands for the episode."""
    traces = _traces(_as_mapping(episode, "episode"))
    return next((index for index, trace in enumerate(traces) if _trainable(trace)), 0)


def trace_to_sample(
    trace: Any, rollout_number: int = 1, episode_id: str | None = None, *, finite: bool = False
) -> dict[str, Any]:
    """One trace (a mapping or a ``to_record()`` object) as a v0 sample row:
    ``completion`` is the last branch's messages, ``trajectory`` one entry per
    branch, non-finite numbers are null.

    ``finite=True`` says the input holds no NaN or infinity (it was parsed from
    JSON, as the SDK's sinks read it from the journal): the copy that turns
    them into null is then skipped.
    """
    trace = _as_mapping(trace, "trace")
    data = _without_none(_task_data(trace))
    branches = _branches(trace)
    tools = trace.get("tools") or []
    errors = trace.get("errors") or []
    info = trace.get("info") or {}
    sample: dict[str, Any] = {
        "sample_id": trace.get("id"),
        "example_id": data.get("idx"),
        "rollout_number": rollout_number,
        "episode_id": episode_id,
        "agent": _agent(trace).get("name", "agent"),
        "trainable": _trainable(trace),
        "task": data,
        "prompt": [],
        "completion": branches[-1]["messages"] if branches else [],
        "answer": data.get("answer"),
        "tool_defs": [_without_none(tool) for tool in tools] if tools else None,
        "reward": trace_reward(trace),
        "timing": trace.get("timing") or {},
        "is_completed": bool(trace.get("is_completed", False)),
        "is_truncated": _is_truncated(trace),
        "metrics": trace.get("metrics") or {},
        "error": _without_none(errors[-1]) if errors else None,
        "stop_condition": trace.get("stop_condition"),
        "trajectory": branches,
        "token_usage": _aggregate_usage(_usages(trace.get("calls") or [])),
        "info": dict(info) or None,
    }
    # v0 flattened each sub-reward to a top-level key, unless the key is taken.
    for name, reward in (trace.get("rewards") or {}).items():
        if reward is not None:
            sample.setdefault(name, reward["score"])
    if finite:
        return sample
    result: dict[str, Any] = nullify_non_finite(sample)
    return result


def episode_to_samples(
    episode: Any, rollout_number: int, *, finite: bool = False
) -> list[dict[str, Any]]:
    """An episode's v0 rows: normally one, the summary trace's projection with
    the episode id as ``sample_id`` and the whole record in
    ``info.native_wrapper``. An episode whose row would not fit one request
    falls back to one row per trace, without ``native_wrapper``."""
    return [row for row, _ in _episode_rows(episode, rollout_number, finite=finite)]


def _episode_rows(
    episode: Any,
    rollout_number: int,
    *,
    finite: bool,
    encoded_record: bytes | None = None,
    traces: list[Mapping[str, Any]] | None = None,
) -> list[tuple[dict[str, Any], bytes | None]]:
    """``episode_to_samples``' rows, each with its compact JSON when sizing it
    made that (``orjson.dumps`` of the row, None otherwise). ``encoded_record``
    and ``traces``: as ``sample_rows`` takes them."""
    record = _as_mapping(episode, "episode")
    if traces is None:
        traces = _traces(record)
    if not traces:
        return []
    summary_index = next((i for i, trace in enumerate(traces) if _trainable(trace)), 0)
    episode_id = record.get("id")
    sample = trace_to_sample(traces[summary_index], rollout_number, episode_id, finite=finite)
    sample["sample_id"] = episode_id
    wrapper: Any = record
    if not finite:
        wrapper = nullify_non_finite(record)  # the trace's info is nullified already
    elif encoded_record is not None:
        # The record's JSON as made already: orjson writes it in as it is,
        # the very bytes it would write of the record (half the row's bytes,
        # encoded once for both the Prime Traces line and this row).
        wrapper = orjson.Fragment(encoded_record)  # orjson 3.9.4 on; the floor is later
    sample["info"] = {
        **(sample["info"] or {}),
        "native_wrapper": wrapper,
        "native_trace_index": summary_index,
    }
    encoded: bytes | None = None
    try:
        encoded = orjson.dumps(sample)
        size = len(encoded)
    except TypeError:  # what orjson cannot encode: sized as ``encode_json`` sends it
        size = json_bytes(sample)
    # Read at call time so that tests can lower the ceiling.
    if ENVELOPE_BYTES + size <= MAX_SAMPLES_PAYLOAD_BYTES:
        return [(sample, encoded)]
    logger.warning(
        "Episode %s exceeds the platform sample limit; uploading one row per trace", episode_id
    )
    return [
        (trace_to_sample(trace, rollout_number, episode_id, finite=finite), None)
        for trace in traces
    ]


def record_to_samples(
    record: Any, rollout_numbers: MutableMapping[Any, int], *, finite: bool = False
) -> list[dict[str, Any]] | None:
    """One record's v0 rows, numbering its rollout in ``rollout_numbers``.

    A mapping holding ``sample_id`` is already a v0 row and passes through as a
    copy; an episode (mapping or object) is projected (an episode without
    traces gives ``[]``); anything else (a bare trace) has no projection:
    ``None``, for the caller to count as skipped.
    """
    rows = _record_rows(record, rollout_numbers, finite=finite)
    return None if rows is None else [row for row, _ in rows]


class SampleRows(NamedTuple):
    """A record's v0 rows, encoded before its rollout is numbered: what the
    sample table's sink sends of it once it knows the number (``pieces``).

    Made once per episode for whichever sink parses it first (``ship.parsed``):
    bytes and strings only, which the garbage collector never walks, where
    the parsed record is hundreds of containers. Each row is encoded with
    the number 0, whose one digit is at ``cuts[i]``: a row's first keys are
    ``sample_id``, ``example_id`` and ``rollout_number``
    (``trace_to_sample``), and orjson writes a dict's items in order, each
    on its own, so the row numbered n is the same bytes with n's digits
    there (checked as made).
    """

    #: The task index the rollout is numbered under (``numbered`` only).
    key: Any
    #: False: rows that are v0 rows already (sent as they are), or none.
    numbered: bool
    sample_ids: tuple[str, ...]
    rows: tuple[bytes, ...]
    cuts: tuple[int, ...]
    #: The single row's bytes to spare under the request ceiling with a
    #: one-digit number; None when the episode went one row per trace.
    room: int | None

    def pieces(self, number: int) -> tuple[list[bytes | memoryview], int]:
        """The rows, the rollout numbered ``number``: their pieces, each row
        followed by a comma (for one ``join`` into the request, copying the
        rows once), and their bytes with those commas."""
        pieces: list[bytes | memoryview] = []
        if not self.numbered:
            for row in self.rows:
                pieces += (row, b",")
            return pieces, sum(map(len, self.rows)) + len(self.rows)
        digits = b"%d" % number
        for row, cut in zip(self.rows, self.cuts, strict=True):
            whole = memoryview(row)
            pieces += (whole[:cut], digits, whole[cut + 1 :], b",")
        return pieces, sum(map(len, self.rows)) + len(self.rows) * len(digits)

    def fits(self, number: int) -> bool:
        """Whether the rows as made are the episode's rows numbered
        ``number``: its single row still fits the ceiling with the number's
        digits (else it goes one row per trace: ``record_to_samples``)."""
        return self.room is None or len(b"%d" % number) - 1 <= self.room


def numbered_rows(
    record: Any, number: int, *, finite: bool = False
) -> tuple[tuple[str, ...], list[bytes]]:
    """A record's v0 rows numbered ``number`` (as ``record_to_samples`` would
    number them), encoded, with their sample ids: where ``SampleRows`` do
    not fit their number (``SampleRows.fits``)."""
    rows = _record_rows(record, {}, finite=finite, number=number) or []
    ids = tuple(str(row.get("sample_id")) for row, _ in rows)
    return ids, [orjson.dumps(row) if encoded is None else encoded for row, encoded in rows]


def sample_rows(
    record: Any, *, finite: bool = False, encoded: bytes | None = None
) -> SampleRows | None:
    """``record_to_samples``' rows, encoded (each once) before the rollout is
    numbered: None where it gives None. ``encoded``: ``orjson.dumps(record)``,
    where the caller made it already (the Prime Traces line of a stamped
    episode: ``sinks.forms``), written into the row as it is (with
    ``finite`` only: else the record's copy in the row is nullified)."""
    if _is_mapping(record) and "sample_id" in record:
        row = dict(record)
        return SampleRows(None, False, (str(row.get("sample_id")),), (orjson.dumps(row),), (), None)
    traces: list[Mapping[str, Any]] = []
    rows = _record_rows(record, {}, finite=finite, number=0, encoded=encoded, traces_out=traces)
    if rows is None:
        return None
    if not rows:
        return SampleRows(None, False, (), (), (), None)
    wholes: list[bytes] = []
    cuts: list[int] = []
    for row, encoded in rows:
        whole = orjson.dumps(row) if encoded is None else encoded
        head = b"".join(
            (
                b'{"sample_id":',
                orjson.dumps(row["sample_id"]),
                b',"example_id":',
                orjson.dumps(row["example_id"]),
                b',"rollout_number":0,',
            )
        )
        if not whole.startswith(head):  # trace_to_sample's order: never
            raise AssertionError("a sample row does not start with its id and number")
        wholes.append(whole)
        cuts.append(len(head) - 2)
    mapping = _as_mapping(record, "episode")
    room = None
    if len(rows) == 1 and rows[0][0]["sample_id"] == mapping.get("id"):
        room = MAX_SAMPLES_PAYLOAD_BYTES - ENVELOPE_BYTES - len(wholes[0])
    return SampleRows(
        _rollout_key(traces),
        True,
        tuple(str(row.get("sample_id")) for row, _ in rows),
        tuple(wholes),
        tuple(cuts),
        room,
    )


def _record_rows(
    record: Any,
    rollout_numbers: MutableMapping[Any, int],
    *,
    finite: bool,
    number: int | None = None,
    encoded: bytes | None = None,
    traces_out: list[Mapping[str, Any]] | None = None,
) -> list[tuple[dict[str, Any], bytes | None]] | None:
    """The rows, numbered in ``rollout_numbers`` (or ``number``, left out of
    it). ``encoded``: as ``sample_rows`` takes it. ``traces_out``: given the
    episode's traces (as mappings), read once here, for the caller."""
    if _is_mapping(record):
        if "sample_id" in record:
            return [(dict(record), None)]
        if "traces" not in record:
            return None
    elif not hasattr(record, "traces"):
        return None
    mapping = _as_mapping(record, "episode")
    traces = _traces(mapping)
    if traces_out is not None:
        traces_out[:] = traces
    if not traces:
        return []
    if number is None:
        idx = _rollout_key(traces)
        rollout_numbers[idx] = number = rollout_numbers.get(idx, 0) + 1
    return _episode_rows(mapping, number, finite=finite, encoded_record=encoded, traces=traces)


def _rollout_key(traces: Sequence[Mapping[str, Any]]) -> Any:
    """What an episode's rollouts are numbered under: its summary trace's task index."""
    summary = next((trace for trace in traces if _trainable(trace)), traces[0])
    return _task_data(summary).get("idx")


def build_samples(
    episodes: Sequence[Any],
    rollout_numbers: dict[Any, int] | None = None,
    *,
    finite: bool = False,
) -> list[dict[str, Any]]:
    """Project episodes (objects with ``to_record()`` or mappings of that shape)
    to v0 sample rows.

    ``rollout_number`` is 1-based per example, keyed by the summary trace's
    ``task.data.idx``; a streaming caller passes the same ``rollout_numbers``
    dict on every call so the numbering carries over. Mappings that already
    hold ``sample_id`` pass through as rows; records with no projection (bare
    traces) and episodes without traces give no row. ``finite``: as
    ``trace_to_sample``'s.
    """
    counts = rollout_numbers if rollout_numbers is not None else {}
    samples: list[dict[str, Any]] = []
    for episode in episodes:
        samples.extend(record_to_samples(episode, counts, finite=finite) or ())
    return samples


def batch_samples(samples: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows packed into requests of at most 25 MiB (the platform's per-request
    ceiling): the envelope, then each row's compact JSON plus one byte for its
    comma.

    Raises ``ValueError`` naming the row when one row cannot fit a request alone,
    rather than dropping it silently.
    """
    batches: list[list[dict[str, Any]]] = []
    batch: list[dict[str, Any]] = []
    size = ENVELOPE_BYTES
    for index, sample in enumerate(samples):
        row_bytes = json_bytes(sample)
        if ENVELOPE_BYTES + row_bytes > MAX_SAMPLES_PAYLOAD_BYTES:
            raise ValueError(
                f"sample {index} (sample_id {sample.get('sample_id')!r}) is too large to "
                f"upload: {ENVELOPE_BYTES + row_bytes} > {MAX_SAMPLES_PAYLOAD_BYTES} bytes"
            )
        grown = size + (1 if batch else 0) + row_bytes
        if batch and grown > MAX_SAMPLES_PAYLOAD_BYTES:
            batches.append(batch)
            batch = []
            grown = ENVELOPE_BYTES + row_bytes
        batch.append(sample)
        size = grown
    if batch:
        batches.append(batch)
    return batches


# --------------------------------------------------------------------------- Parquet


def parquet_available() -> bool:
    """Whether pyarrow (the ``prime-runs[train]`` extra) can be imported."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _train_sample_row_type() -> pyarrow.StructType:
    """The schema's columns as one struct type: a step's rows convert to it
    in one pass (``_train_sample_table``)."""
    import pyarrow as pa

    return pa.struct(list(train_sample_schema()))


def _train_sample_table(rows: list[dict[str, Any]]) -> pyarrow.Table:
    """The rows as a table of the viewer's schema, the same table
    ``Table.from_pylist(rows, schema=...)`` makes (columns, types, nulls;
    so the same Parquet bytes). The rows go through Arrow's converter once,
    as one struct array, where ``from_pylist`` gathered each column into a
    list and converted them one by one: 19 conversions an object, half of
    what making its table cost on the shipping thread, which holds the
    interpreter lock for all of it."""
    import pyarrow as pa

    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=_train_sample_row_type()))
    return pa.Table.from_batches([batch], schema=train_sample_schema())


@functools.cache
def train_sample_schema() -> pyarrow.Schema:
    """The training viewer's table schema, column for column (built once:
    a schema is immutable, and every object of a sync used to build it)."""
    import pyarrow as pa

    string, int64, float64 = pa.string(), pa.int64(), pa.float64()
    return pa.schema(
        [
            ("run_id", string),
            ("step", int64),
            ("tag", string),
            ("problem_id", int64),
            ("sample_id", int64),
            ("prompt", string),
            ("completion", string),
            ("trajectory", string),
            ("answer", string),
            ("env_name", string),
            ("task", string),
            ("info", string),
            ("reward", float64),
            ("advantage", float64),
            ("metrics", string),
            ("timing", string),
            ("num_input_tokens", int64),
            ("num_output_tokens", int64),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )


def _problem_id(example_id: Any, sample_id: int) -> int:
    if example_id is None:
        return sample_id
    try:
        return int(example_id)
    except (TypeError, ValueError):
        return sample_id


def episodes_to_parquet_rows(
    episodes: Sequence[Any],
    run_id: str,
    step: int,
    *,
    sample_id_offset: int = 0,
    created_at: datetime,
    finite: bool = False,
) -> list[dict[str, Any]]:
    """The rows of ``episodes_to_parquet_bytes``, before encoding (no pyarrow)."""
    records = [_as_mapping(episode, f"episodes[{i}]") for i, episode in enumerate(episodes)]
    advantages: dict[Any, Any] = {}
    env_names: dict[Any, str] = {}
    for record in records:
        traces = _traces(record)
        if not traces:
            continue
        summary = next((trace for trace in traces if _trainable(trace)), traces[0])
        advantages[record.get("id")] = (summary.get("info") or {}).get("advantage")
        env = record.get("env")
        env_id = env.get("id") if isinstance(env, Mapping) else None
        env_names[record.get("id")] = str(env_id or "")

    rows: list[dict[str, Any]] = []
    samples = build_samples(records, finite=finite)
    for sample_id, sample in enumerate(samples, start=sample_id_offset):
        # A row without a trajectory is skipped but still uses up its sample_id.
        if not sample["trajectory"]:
            continue
        advantage = advantages.get(sample["episode_id"])
        trajectory = [{**branch, "advantage": advantage} for branch in sample["trajectory"]]
        rows.append(
            {
                "run_id": run_id,
                "step": step,
                "tag": "",
                "problem_id": _problem_id(sample["example_id"], sample_id),
                "sample_id": sample_id,
                "prompt": "",
                "completion": _json_column(sample["completion"]),
                "trajectory": _json_column(trajectory),
                "answer": "",
                "env_name": env_names.get(sample["episode_id"], ""),
                "task": _json_column(sample["task"]),
                "info": _json_column(sample["info"]),
                "reward": sample["reward"],
                "advantage": advantage,
                "metrics": _json_column(sample["metrics"]),
                "timing": _json_column(sample["timing"]),
                "num_input_tokens": trajectory[-1]["num_input_tokens"],
                "num_output_tokens": trajectory[-1]["num_output_tokens"],
                "created_at": created_at,
            }
        )
    return rows


def episodes_to_parquet_bytes(
    episodes: Sequence[Any],
    run_id: str,
    step: int,
    *,
    sample_id_offset: int = 0,
    created_at: datetime | None = None,
    finite: bool = False,
) -> bytes | None:
    """One training step's episodes as one Parquet object of the viewer's
    table, rows numbered from ``sample_id_offset``.

    Returns ``None`` when no row has a trajectory (no object is made).
    ``created_at`` (default: now, UTC) is shared by every row; with it fixed,
    identical input gives byte-identical output, which is what lets an
    in-flight upload be resent unchanged. ``finite``: the episodes hold no
    NaN or infinity (parsed from JSON), so no copy nulls them
    (``trace_to_sample``). Needs pyarrow (``ImportError`` otherwise).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if created_at is None:
        created_at = datetime.now(UTC)
    rows = episodes_to_parquet_rows(
        episodes,
        run_id,
        step,
        sample_id_offset=sample_id_offset,
        created_at=created_at,
        finite=finite,
    )
    if not rows:
        return None
    table = _train_sample_table(rows)
    # Arrow's own buffer: the writer's many small writes (a page header, a
    # column chunk, the footer) stay in C++, where a BytesIO took each one
    # back into Python (an eighth of an object's CPU). The same bytes.
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy", use_dictionary=True, write_statistics=True)
    blob: bytes = sink.getvalue().to_pybytes()
    return blob
