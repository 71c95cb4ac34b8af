"""The training sample table: one Parquet object per step upload, through
presign, then PUT to object storage, then confirm (see docs/ARCHITECTURE.md,
"The wire").

Only episodes of training work on the cadence (every ``interval``-th step)
become rows; others are skipped, which is not a loss. A batch is one object:
the episodes of one step, up to the first episode of another step on the
cadence, so the acknowledged offset moves with every confirmed object (a
flaky link that confirmed step 0 and not yet step 10 has step 0 behind it).
The object is built once, numbered in its own ``sample_id`` range, and
recorded in the journal before the first attempt; the presigned key is
recorded as soon as it is minted, and that the PUT landed as soon as it did.
A resend after a crash or a lost answer therefore PUTs the same bytes to the
same key, or only confirms again (confirm is idempotent), and never makes a
second object of the same records. A presigned URL the store refuses (it
expired while the sink was paused) is minted anew before anything landed
under it. Asking whether it landed sends a confirm of its key, so a 413 to a
URL minted on an earlier try asks again first: refused whole, the batch's
records would be made again in smaller objects, the one that is stored too.
An object whose confirm finds nothing under its key though the store
answered 2xx to its PUT and to a re-PUT (a gateway that never passed them
on) is minted anew under a new key, a bounded number of times
(``sample_objects.MINTS_UNLANDED``), before its records count as failed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

import orjson

from ..exceptions import APIError, is_record_rejection
from ..journal import Entry
from ..platform import PlatformClient
from ..projection import episodes_to_parquet_bytes, parquet_available
from ..records import training_step
from . import receipts, sample_objects
from .base import Binding, Prepared, SendContext, SinkOff
from .kinds import SINK_KINDS
from .sample_objects import NEW, SampleObjects
from .step_ranges import Block, StepRanges

__all__ = [
    "DEFAULT_INTERVAL",
    "TrainSamplesProgress",
    "TrainSamplesSink",
    "pack_units",
    "unpack_units",
]

DEFAULT_INTERVAL = 10
_LEN = struct.Struct(">I")
# A step's run of entries: its step, its episodes, its last entry's seq, and
# whether another step began after it (``TrainSamplesSink._step_runs``). A
# step of None: entries off the cadence before one that cannot be read.
_Run = tuple[int | None, list[dict[str, Any]], int, bool]


def _until_unreadable(runs: Iterator[_Run], taken: Callable[[], bool]) -> Iterator[_Run]:
    """The step runs, ending before an entry that cannot be read once an
    entry before it is ``taken`` into the batch (in an object, or settled
    as making none): ``prepare`` raises only for its first entry, the one
    the shipper counts as failed."""
    while True:
        try:
            yield next(runs)
        except StopIteration:
            return
        except orjson.JSONDecodeError:
            if taken():
                return
            raise


def pack_units(units: list[tuple[dict[str, Any], bytes]]) -> bytes:
    """A batch body: a JSON header naming each object, then the objects."""
    header = orjson.dumps([meta for meta, _ in units])
    return _LEN.pack(len(header)) + header + b"".join(blob for _, blob in units)


def unpack_units(body: bytes) -> list[tuple[dict[str, Any], bytes]]:
    (size,) = _LEN.unpack_from(body)
    metas = orjson.loads(body[_LEN.size : _LEN.size + size])
    out: list[tuple[dict[str, Any], bytes]] = []
    offset = _LEN.size + size
    for meta in metas:
        out.append((meta, body[offset : offset + meta["bytes"]]))
        offset += meta["bytes"]
    return out


@dataclass(frozen=True)
class TrainSamplesProgress:
    """How far a batch's objects got: ``done`` of them confirmed, and for the
    next one its presigned ``key`` and ``url`` once minted, and whether its
    PUT landed (``put``). ``done`` has no default, so that a new batch's
    record says ``done: 0``, as it always has; the others are recorded once set.

    A batch of several objects (a backlog's) records each object's stage,
    key and URL instead, by its place in the batch (``sinks.sample_objects``);
    a batch of one keeps the form journals always had. Such a batch records
    ``put`` as null: a version before them (1f3d32e) reads it as damage and
    counts the batch's records as failed, where it would have resent every
    object from ``done`` on under new keys, a second object of each one
    already confirmed.
    """

    done: int
    key: str | None = None
    url: str | None = None
    put: bool | None = False
    stages: tuple[int, ...] = ()
    keys: tuple[str | None, ...] = ()
    urls: tuple[str | None, ...] = ()
    #: By object: how many keys were found empty after both PUTs of its bytes
    #: were answered 2xx (``sample_objects.not_landed``); recorded once set.
    unlanded: tuple[int, ...] = ()


class TrainSamplesSink:
    name = "train_samples"
    kinds = SINK_KINDS["train_samples"]
    max_entries = 512
    max_bytes = 64 * 1024 * 1024
    # A batch is one step's episodes: the shipper reads about twice the last
    # step's for the next, not 512 (ship.readahead.next_want).
    reads_ahead_of_batch = True
    isolates_rejections = False
    # Episodes of steps off the cadence, and steps with no trajectory, make no row.
    passes_over_entries = True
    progress_type = TrainSamplesProgress

    def __init__(
        self,
        client: PlatformClient,
        *,
        interval: int = DEFAULT_INTERVAL,
        ranges: Block | None = None,
    ) -> None:
        self._client = client
        self._interval = interval
        # Next range index per step, in this process's block: a rank's own, a
        # forked child's far at random (never its parent's ranges).
        self._block = ranges
        self._ranges = StepRanges(ranges)
        self._objects = SampleObjects(self._presign, self._put, self._confirm_key)
        # Whether this platform was seen naming the key in a confirm's answer:
        # from then on a silent answer is a gateway's, not the platform's.
        self._confirms_proven = False

    def restore(self, carry: Mapping[str, Any]) -> None:
        # None or {}: ranges from the start (a batch refused whole was the first).
        self._ranges = StepRanges.from_carry(carry, self._block)

    def prepare(
        self, entries: Sequence[Entry], binding: Binding
    ) -> Prepared[TrainSamplesProgress] | None:
        if not parquet_available():
            raise SinkOff(
                "pyarrow is not installed, so the training sample table is off; "
                "install prime-runs[train] to enable it (primeruns replay from a machine "
                "that has it ships the table)",
                lasting=False,
            )
        created_at = datetime.now(UTC)
        ranges = self._ranges
        units: list[tuple[dict[str, Any], bytes]] = []
        records = size = 0
        last_seq = entries[0].seq - 1
        first = entries[0].seq
        runs = _until_unreadable(self._step_runs(entries), lambda: last_seq >= first)
        for step, episodes, ends_at, closed in runs:
            # Only steps the read shows whole join a first one: the last may
            # go on past the read (the shipper then reads again, in full).
            if units and (
                not closed
                or len(units) >= sample_objects.MAX_OBJECTS
                or size >= sample_objects.MAX_BATCH_BYTES
            ):
                break
            if step is None:
                last_seq = ends_at  # off the cadence: they make no row
                continue
            index = ranges.next_for(step)
            try:
                blob = episodes_to_parquet_bytes(
                    episodes,
                    binding.run_id,
                    step,
                    sample_id_offset=index << 32,
                    created_at=created_at,
                    finite=True,  # parsed from JSON (``_step_runs``): no null-ing copy
                )
            except Exception:
                if units:
                    # Raised only for the first step: the shipper counts the
                    # first entry as failed, so it must be this step's.
                    break
                raise
            if blob is None:
                last_seq = ends_at  # (taken: ends a batch before an unreadable entry)
                continue  # no episode of it has a trajectory: no object, on to the next step
            # Kept once the batch is recorded (the shipper hands the carry back).
            ranges = ranges.used(step, index)
            meta = {"step": step, "range": index, "bytes": len(blob), "records": len(episodes)}
            units.append((meta, blob))
            records += len(episodes)
            size += len(blob)
            last_seq = ends_at
        if not units:
            if first <= last_seq < entries[-1].seq:
                # Ended before an entry that cannot be read: those before it
                # are settled by a batch of no object (none acknowledged as
                # None would, past it; none counted failed as a raise would).
                return Prepared(
                    body=pack_units([]),
                    records=0,
                    progress=TrainSamplesProgress(done=0),
                    last_seq=last_seq,
                    carry=ranges.to_carry(),
                )
            return None  # nothing of these entries makes an object
        count = len(units)
        progress = TrainSamplesProgress(done=0)
        if count > 1:
            progress = replace(
                progress,
                put=None,  # see TrainSamplesProgress
                stages=(NEW,) * count,
                keys=(None,) * count,
                urls=(None,) * count,
            )
        return Prepared(
            body=pack_units(units),
            records=records,
            progress=progress,
            last_seq=None if last_seq == entries[-1].seq else last_seq,
            carry=ranges.to_carry(),
        )

    def _step_runs(self, entries: Sequence[Entry]) -> Iterator[_Run]:
        """The entries cut where the next step on the cadence begins: per run,
        (its step, its episodes, the seq of its last entry, whether another
        step began after it). Episodes off the cadence belong to the run
        they stand in (they make no row)."""
        step: int | None = None
        records: list[dict[str, Any]] = []
        last_seq = entries[0].seq - 1
        for entry in entries:
            try:
                record = orjson.loads(entry.payload)
            except orjson.JSONDecodeError:
                # The steps before it go first: prepare raises only for the
                # first entry, which the shipper counts as failed, alone.
                if step is not None or last_seq >= entries[0].seq:
                    yield step, records, last_seq, True
                raise
            found = training_step(record)
            on_cadence = found is not None and not found % self._interval
            if on_cadence and step is not None and found != step:
                yield step, records, last_seq, True
                records = []
            if on_cadence:
                step = found
                records.append(record)
            last_seq = entry.seq
        if step is not None:
            yield step, records, last_seq, False

    def send(self, body: bytes, ctx: SendContext[TrainSamplesProgress]) -> None:
        run_id = ctx.binding.run_id
        units = unpack_units(body)
        progress = ctx.progress
        if progress.stages or progress.keys or progress.urls or progress.put is None:
            # A backlog's batch of several objects (``put`` null marks it):
            # its stages are checked there. Stages emptied or gone are damage,
            # not a batch of the other form, which would make every object
            # from ``done`` on again under a new key.
            self._objects.send(units, ctx)
            return
        for index in range(ctx.progress.done, len(units)):
            meta, blob = units[index]
            step = meta["step"]
            key, url = ctx.progress.key, ctx.progress.url
            minted_now = not key or not url
            if minted_now:
                minted = self._client.api(
                    "POST", "/rft/samples/presign", {"run_id": run_id, "step": step}
                )
                # Without both, a gateway's answer: minting again is harmless.
                url, key = receipts.presigned(minted)
                ctx.save_progress(replace(ctx.progress, key=key, url=url))
            confirm = {"run_id": run_id, "step": step, "s3_key": key}
            done = TrainSamplesProgress(done=index + 1)  # the next object starts afresh
            if not ctx.progress.put:
                try:
                    self._client.put_object(str(url), blob, "application/parquet")
                except APIError as exc:
                    if exc.status_code not in (403, 413) or minted_now:
                        raise
                    if exc.status_code == 413:
                        self._too_large(confirm, exc)  # raises unless the object is there
                    else:
                        self._expired(confirm, ctx, exc)  # raises unless the object is there
                    ctx.save_progress(done)
                    continue
                ctx.save_progress(replace(ctx.progress, put=True))
            try:
                sample_objects.confirm_put_object(
                    partial(self._confirm, confirm), partial(self._put, str(url), blob)
                )
            except sample_objects.NothingLanded as nothing:
                keys = sample_objects.unlanded_of(ctx.progress.unlanded, index) + 1
                error = sample_objects.not_landed(nothing.refused, step, keys)
                if not is_record_rejection(error):  # minted anew on the next try
                    unlanded = sample_objects.with_unlanded(ctx.progress.unlanded, index, keys)
                    fresh = replace(ctx.progress, key=None, url=None, put=False, unlanded=unlanded)
                    ctx.save_progress(fresh)
                raise error from None
            ctx.save_progress(done)

    def _presign(self, run_id: str, step: int) -> tuple[str, str]:
        # Without both, a gateway's answer: minting again is harmless.
        return receipts.presigned(
            self._client.api("POST", "/rft/samples/presign", {"run_id": run_id, "step": step})
        )

    def _put(self, url: str, blob: bytes) -> None:
        self._client.put_object(url, blob, "application/parquet")

    def _confirm_key(self, run_id: str, step: int, key: str) -> None:
        self._confirm({"run_id": run_id, "step": step, "s3_key": key})

    def close(self) -> None:
        """Its shipper is done: the helper threads of a backlog's batches go."""
        self._objects.close()

    def _confirm(self, body: dict[str, Any]) -> None:
        """Confirm an object; raise unless its answer may be taken.

        The contract lets the platform answer a confirm with nothing, and it
        offers no read of the table to look in, so a silent answer cannot be
        refused outright. But a gateway's empty 200 to a confirm it never
        forwarded is silent too, and taking it lost the step's samples
        without a count. Confirm is idempotent, so a silent answer is
        checked by confirming again: once this platform named the key in an
        answer, a silent one is a gateway's and proves nothing (resent);
        before that, one more confirm is sent, and a second silent answer
        is taken as the contract allows. One naming another key never is.
        """
        key = body["s3_key"]
        if self._confirmed(body, key):
            return
        if self._confirms_proven:
            raise receipts.unproven(f"the confirm of {key} was answered with nothing")
        self._confirmed(body, key)

    def _confirmed(self, body: dict[str, Any], key: str) -> bool:
        """One confirm: whether its answer named the key (else it was silent)."""
        proven = receipts.confirm_proves(
            self._client.api("POST", "/rft/samples/confirm", body), key
        )
        if proven:
            self._confirms_proven = True
        return proven

    def _too_large(self, confirm: dict[str, Any], exc: APIError) -> None:
        """A URL minted on an earlier try refused as too large (413): a
        confirm of its key may have gone before (its URL found expired, the
        answer lost), and the object be stored. Refused whole, the batch
        would be halved and its records made again in smaller objects:
        stored twice. So a confirm of the key tells first (a repeat is a
        200): returns if the object is there; raises ``exc`` if nothing is
        (400, 404), for the shipper to halve the batch; else what it got."""
        try:
            self._confirm(confirm)
        except APIError as refused:
            if refused.status_code in (400, 404):
                raise exc from None
            raise

    def _expired(
        self, confirm: dict[str, Any], ctx: SendContext[TrainSamplesProgress], exc: APIError
    ) -> None:
        """A URL minted on an earlier try refused (``expired_url_landed``):
        returns if the object is there; else records it as not minted and
        raises, so that a new URL is minted on the next try."""
        nothing = sample_objects.expired_url_landed(lambda: self._confirm(confirm), exc)
        if nothing is not None:
            ctx.save_progress(replace(ctx.progress, key=None, url=None))
            raise nothing from exc
