"""The evaluation sample table: one v0 row per episode, pushed in requests of at
most 25 MiB (see docs/ARCHITECTURE.md, "The wire").

The endpoint appends and does not deduplicate, so a blind resend after an
ambiguous failure (the server stored the rows, the answer was lost) would
double them. The sink therefore reads the table's length (``total``) before a
batch's first send and records it with the batch, durably, as ``attempted``.
A batch found attempted (a lost answer, or a restart mid-request) is first
looked for in the rows stored since that length, and only sent again when
its rows are not all there.

Several processes may push to one evaluation (forked children, pool workers,
ranks: each ships its own journal), so a batch that was stored need not be
at the table's tail: others may have appended after it. It is at or past the
recorded length, though (the table only grows, and reads page it in the
order rows were appended), so the look reads forward from there and stops
once every row of the batch was seen: its cost is bounded by what was pushed
since the attempt, whatever the run's length (and a look cut short by a
failure goes on where it stopped). The rows are known by
``sample_id``, an episode's own id (a trace's for an oversized episode):
unique across the run's processes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from primeruns.logs import get_logger

from ..exceptions import APIError, is_transient
from ..journal import Entry
from ..platform import PlatformClient
from ..platform.errors import OversizeAnswerError
from ..platform.paths import segment
from ..projection import SampleRows
from . import receipts
from .base import Binding, Prepared, SendContext, parse_entry
from .forms import numbered_rows_of, rows_of
from .kinds import SINK_KINDS
from .rollout_numbers import RolloutNumbers

__all__ = ["MAX_REQUEST_BYTES", "EvalSamplesProgress", "EvalSamplesSink"]

#: The platform's per-request ceiling for a samples push.
MAX_REQUEST_BYTES = 25 * 1024 * 1024
_ENVELOPE = len(b'{"samples":[]}')
_PAGE = 100
_COUNT = {"page": 1, "limit": 1}  # a read for the table's ``total`` alone
# The most bytes read of a page of one row. A row may be as large as a push
# (MAX_REQUEST_BYTES), over the client's bound for an answer
# (plain.MAX_ANSWER_BYTES), and so may a page of 100 smaller ones: the table's
# length (a page of its first row) is read within this, and a page of rows
# past the client's bound is read again a row at a time. Twice a push, for
# the page's envelope and a platform that escapes more than the SDK did.
_ROW_BYTES = 2 * MAX_REQUEST_BYTES

log = get_logger("primeruns.ship")


@dataclass(frozen=True)
class EvalSamplesProgress:
    """A batch's rows (``sample_ids``, to look for), whether it was ever sent
    (``attempted``: recorded once it was) and the table's length read just
    before its first send (``base``: its rows, if stored, are at or past it;
    None in a batch an earlier version attempted, looked for from the start)."""

    sample_ids: tuple[str, ...]
    attempted: bool = False
    base: int | None = None


class EvalSamplesSink:
    """Pushes v0 sample rows to ``POST /evaluations/{id}/samples``."""

    name = "eval_samples"
    kinds = SINK_KINDS["eval_samples"]
    # A few hundred episodes a push (~5 MiB of gsm8k samples), not 2,000: the
    # platform parses a push while this sink waits on it, so a backlog shipped
    # in 25 MiB pushes kept the two taking turns, and the last push after the
    # loop ended was most of what finish() waited for (tools/bench/end_to_end.py).
    max_entries = 256
    max_bytes = 24 * 1024 * 1024
    isolates_rejections = False
    progress_type = EvalSamplesProgress
    # prepare reads the rollout numbering, which only ``restore`` changes, and
    # nothing send does (``ship.early``): the next push is encoded while this
    # one is in flight.
    prepares_while_sending = True
    # Its carry is the chunks of the numbering a batch changed (``Sink``).
    carries_parts = True

    def __init__(
        self,
        client: PlatformClient,
        *,
        rows: Callable[[Entry, Binding], SampleRows | None] | None = None,
    ) -> None:
        """``rows``: an entry's rows (the shipper's, made once with the other
        sinks' forms of the entry: ``ship.parsed``; default: made here)."""
        self._client = client
        self._rows = rows or _rows_here
        # Per task index, how many rollouts were numbered so far; carried from
        # batch to batch (and across restarts) through the journal, in parts.
        self._rollouts = RolloutNumbers()

    def prepare(
        self, entries: Sequence[Entry], binding: Binding
    ) -> Prepared[EvalSamplesProgress] | None:
        # Each row's pieces and a comma after it, joined once into the body.
        pieces: list[bytes | memoryview] = []
        ids: list[str] = []
        size = _ENVELOPE
        last_seq = entries[0].seq
        consumed = 0
        rollouts = self._rollouts.batch()
        for entry in entries:
            try:
                made = self._rows(entry, binding)
            except Exception:
                # The shipper fails the first entry of a batch whose prepare
                # raises: ship what came before; this one fails alone. (With
                # no row before it, a batch of none would acknowledge it.)
                if pieces:
                    break
                raise
            number = 0
            more: list[bytes | memoryview] = []
            add = 0
            sample_ids: tuple[str, ...] = ()
            if made is not None:
                # Numbered over the batch's numbering so far, which takes the
                # number only once the entry is taken.
                number = rollouts.next_for(made.key) if made.numbered else 0
                if made.fits(number):
                    (more, add), sample_ids = made.pieces(number), made.sample_ids
                else:  # its one row grew past the ceiling with the number's digits
                    sample_ids, rows = numbered_rows_of(parse_entry(entry), binding, number)
                    for row in rows:
                        more += (row, b",")
                    add = sum(len(row) + 1 for row in rows)
            if pieces and size + add > MAX_REQUEST_BYTES:
                break
            if _ENVELOPE + add > MAX_REQUEST_BYTES:
                if pieces:
                    break
                raise ValueError(
                    f"episode at journal entry {entry.seq} projects to {add} bytes of sample "
                    f"rows, over the {MAX_REQUEST_BYTES}-byte request limit"
                )
            if made is not None and made.numbered:
                rollouts.take(made.key, number)
            pieces += more
            ids.extend(sample_ids)
            size += add
            last_seq = entry.seq
            consumed += 1
        if not pieces:
            return None
        pieces[-1] = b"]}"  # the last row's comma
        body = b"".join([b'{"samples":[', *pieces])
        return Prepared(
            body=body,
            records=consumed,
            progress=EvalSamplesProgress(sample_ids=tuple(ids)),
            last_seq=None if last_seq == entries[-1].seq else last_seq,
            # Not kept here yet: the shipper hands the carry back (restore)
            # once the batch is recorded; a batch prepared again after a
            # failed recording must number its rows as the first time.
            # Only the parts of the numbering this batch changed
            # (``rollout_numbers``): the shipper saves them one by one.
            carry=rollouts.carry(),
            tidied=rollouts.tidied(),
        )

    def restore(self, carry: Mapping[str, Any]) -> None:
        """Continue numbering where the last recorded batch left off: take
        the parts ``carry`` holds (at start-up, every part saved)."""
        bad = self._rollouts.restore(carry)
        if bad:
            # A damaged journal: the examples of what is readable number on.
            log.warning(
                "%s: %d items of the carried rollout numbering are unreadable; left out",
                self.name,
                bad,
            )

    def send(self, body: bytes, ctx: SendContext[EvalSamplesProgress]) -> None:
        path = f"/evaluations/{segment(ctx.binding.run_id)}/samples"
        if ctx.progress.attempted and self._already_stored(path, ctx):
            return
        progress = ctx.progress
        if progress.base is None:
            # Where the table ends now: every row pushed from here on, this
            # batch's included, is at or past it. Kept over resends (every
            # attempt's rows are past it).
            progress = replace(progress, base=self._length(path))
        ctx.save_progress(replace(progress, attempted=True))
        answer = self._client.api("POST", path, body)
        rows = len(progress.sample_ids)
        if receipts.samples_prove(answer, rows, ctx.binding.run_id):
            return
        # A silent 2xx (an empty body or ``{}``: the contract allows it, and so
        # does a gateway that never forwarded the push): the rows are looked for.
        if not self._already_stored(path, ctx):
            raise receipts.unproven(
                f"the samples push of {rows} rows was answered without a receipt "
                "and the rows are not in the table"
            )

    def _length(self, path: str) -> int | None:
        """The table's length now (its ``total``); None where the platform
        refuses the read (a test's mock that answers the push alone): such a
        batch is looked for from the table's start, if ever. A transient
        failure raises: nothing was sent, the batch is tried again later."""
        try:
            return _total(self._client.api("GET", path, params=_COUNT, answer_bytes=_ROW_BYTES))
        except APIError as exc:
            if is_transient(exc):
                raise
            return None

    def _already_stored(self, path: str, ctx: SendContext[EvalSamplesProgress]) -> bool:
        """Whether every row of the batch is in the table past ``base``: read
        page by page from there, until all were seen or the table ends.

        Each page read before the first row of the batch moves ``base`` past
        it, durably: none of the batch is there, and the table only grows at
        its end. A look that fails halfway (a flaky link, many pages pushed
        since the attempt) goes on from there at the next attempt instead of
        starting over, and a resend's look starts where this one ended."""
        missing = Counter(ctx.progress.sample_ids)
        left = len(ctx.progress.sample_ids)
        if not left:
            return False
        at = (ctx.progress.base or 0) // _PAGE * _PAGE  # the first row of the next read
        while True:
            data, limit = self._rows_from(path, at)
            items = receipts.page_items(data, "samples")  # a page, not a gateway's {}
            for row in items:
                found = str(row.get("sample_id")) if isinstance(row, dict) else None
                if found is not None and missing[found] > 0:
                    missing[found] -= 1
                    left -= 1
            if not left:
                return True
            past = at + len(items)  # the rows read so far end here
            if left == len(ctx.progress.sample_ids) and past > (ctx.progress.base or 0):
                ctx.save_progress(replace(ctx.progress, base=past))
            # ``total`` comes with every page (others may still be appending).
            if at + limit >= _total(data):
                return False
            at += limit

    def _rows_from(self, path: str, at: int) -> tuple[Mapping[str, Any], int]:
        """The page of rows from row ``at`` (0 the first) and its length: of
        ``_PAGE`` rows where ``at`` starts one and it is within the client's
        bound for an answer, else of the one row (within ``_ROW_BYTES``), so
        that rows too large for a page of them are read all the same."""
        if not at % _PAGE:
            try:
                params = {"page": at // _PAGE + 1, "limit": _PAGE}
                return self._client.api("GET", path, params=params), _PAGE
            except OversizeAnswerError:
                pass  # read a row at a time, up to the next page
        params = {"page": at + 1, "limit": 1}
        return self._client.api("GET", path, params=params, answer_bytes=_ROW_BYTES), 1


def _total(page: Mapping[str, Any]) -> int:
    """The table's length a read-back page states; raises when it does not."""
    receipts.page_items(page, "samples")  # a page, not a gateway's {}
    total = receipts.count(page.get("total"))
    if total is None:
        raise receipts.unproven("the sample table was read back without its 'total'")
    return total


def _rows_here(entry: Entry, binding: Binding) -> SampleRows | None:
    return rows_of(parse_entry(entry), binding)
