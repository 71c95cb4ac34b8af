"""The evaluation sample table: one v0 row per episode, pushed in requests of at
most 25 MiB (see docs/ARCHITECTURE.md, "The wire").

The endpoint appends and does not deduplicate, so a blind resend after an
ambiguous failure (the server stored the rows, the answer was lost) would
double them. The sink therefore marks a batch as attempted, durably, before
each send; a batch found attempted (a lost answer, or a restart mid-request)
is first looked for at the tail of the table, and only sent again when its
rows are not there. This shipper is the run's only writer, so its last batch,
if stored, is the last rows of the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..journal import Entry
from ..platform import PlatformClient
from ..projection import record_to_samples
from ..records import is_episode, stamp_run
from . import receipts
from .base import Binding, Prepared, SendContext, parse_entry
from .kinds import SINK_KINDS

__all__ = ["MAX_REQUEST_BYTES", "EvalSamplesProgress", "EvalSamplesSink"]

#: The platform's per-request ceiling for a samples push.
MAX_REQUEST_BYTES = 25 * 1024 * 1024
_ENVELOPE = len(b'{"samples":[]}')
_PAGE = 100


@dataclass(frozen=True)
class EvalSamplesProgress:
    """A batch's rows (``sample_ids``, to look for at the table's tail) and
    whether it was ever sent (``attempted``: recorded once it was)."""

    sample_ids: tuple[str, ...]
    attempted: bool = False


class EvalSamplesSink:
    """Pushes v0 sample rows to ``POST /evaluations/{id}/samples``."""

    name = "eval_samples"
    kinds = SINK_KINDS["eval_samples"]
    max_entries = 2000
    max_bytes = 24 * 1024 * 1024
    isolates_rejections = False
    progress_type = EvalSamplesProgress

    def __init__(
        self, client: PlatformClient, *, parse: Callable[[Entry], Any] | None = None
    ) -> None:
        """``parse``: an entry's record (the shipper's, shared with the other
        sinks that take the entry: ``ship.parsed``; default: parsed here)."""
        self._client = client
        self._parse = parse or parse_entry
        # Per task index, how many rollouts were numbered so far; carried from
        # batch to batch (and across restarts) through the journal.
        self._rollouts: dict[Any, int] = {}

    def prepare(
        self, entries: Sequence[Entry], binding: Binding
    ) -> Prepared[EvalSamplesProgress] | None:
        rows_json: list[bytes] = []
        ids: list[str] = []
        size = _ENVELOPE
        last_seq = entries[0].seq
        consumed = 0
        rollouts = dict(self._rollouts)
        for entry in entries:
            record = self._parse(entry)
            if isinstance(record, dict) and is_episode(record):
                # ``native_wrapper`` names the platform's run, as the traces
                # service's copy does: a run logged offline (then replayed)
                # journaled its local id, which the platform never knew.
                record = stamp_run(record, binding.run_id, binding.kind)
            trial = dict(rollouts)
            # Parsed from JSON, so every number is finite: no null-ing copy.
            rows = record_to_samples(record, trial, finite=True) or []
            encoded = [orjson.dumps(row) for row in rows]
            add = sum(len(r) + 1 for r in encoded)
            if rows_json and size + add > MAX_REQUEST_BYTES:
                break
            if _ENVELOPE + add > MAX_REQUEST_BYTES:
                if rows_json:
                    break
                raise ValueError(
                    f"episode at journal entry {entry.seq} projects to {add} bytes of sample "
                    f"rows, over the {MAX_REQUEST_BYTES}-byte request limit"
                )
            rollouts = trial
            rows_json.extend(encoded)
            ids.extend(str(row.get("sample_id")) for row in rows)
            size += add
            last_seq = entry.seq
            consumed += 1
        if not rows_json:
            return None
        body = b'{"samples":[' + b",".join(rows_json) + b"]}"
        return Prepared(
            body=body,
            records=consumed,
            progress=EvalSamplesProgress(sample_ids=tuple(ids)),
            last_seq=None if last_seq == entries[-1].seq else last_seq,
            # Not kept here yet: the shipper hands the carry back (restore)
            # once the batch is recorded; a batch prepared again after a
            # failed recording must number its rows as the first time.
            carry={"rollouts": {str(k): v for k, v in rollouts.items()}},
        )

    def restore(self, carry: Mapping[str, Any]) -> None:
        """Continue numbering where the last recorded batch left off."""
        saved = carry.get("rollouts")
        # None or {}: numbering from the start (a batch refused whole was the first).
        self._rollouts = (
            {_key(k): int(v) for k, v in saved.items()} if isinstance(saved, dict) else {}
        )

    def send(self, body: bytes, ctx: SendContext[EvalSamplesProgress]) -> None:
        path = f"/evaluations/{ctx.binding.run_id}/samples"
        if ctx.progress.attempted and self._already_stored(path, ctx.progress.sample_ids):
            return
        ctx.save_progress(replace(ctx.progress, attempted=True))
        answer = self._client.api("POST", path, body)
        rows = len(ctx.progress.sample_ids)
        if receipts.samples_prove(answer, rows, ctx.binding.run_id):
            return
        # A silent 2xx (an empty body or ``{}``: the contract allows it, and so
        # does a gateway that never forwarded the push): the rows are looked for.
        if not self._already_stored(path, ctx.progress.sample_ids):
            raise receipts.unproven(
                f"the samples push of {rows} rows was answered without a receipt "
                "and the rows are not in the table"
            )

    def _already_stored(self, path: str, sample_ids: Sequence[str]) -> bool:
        wanted = set(sample_ids)
        if not wanted:
            return False
        first = self._client.api("GET", path, params={"page": 1, "limit": 1})
        receipts.page_items(first, "samples")  # a page, not a gateway's {}
        total = first.get("total")
        if not isinstance(total, int) or isinstance(total, bool):
            raise receipts.unproven("the sample table was read back without its 'total'")
        if total < len(sample_ids):
            return False
        start = total - len(sample_ids)  # 0-based index of the batch's first row
        seen: set[str] = set()
        for page in range(start // _PAGE + 1, math.ceil(total / _PAGE) + 1):
            data = self._client.api("GET", path, params={"page": page, "limit": _PAGE})
            for row in receipts.page_items(data, "samples"):
                if isinstance(row, dict):
                    seen.add(str(row.get("sample_id")))
        return wanted <= seen


def _key(value: Any) -> Any:
    """Task indexes are ints in records; JSON object keys come back as strings."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value
