"""Each sink's cursor (its acknowledged offset and in-flight batch) and the loss counters.

A cursor moves in one transaction with what it describes: recording a batch
stores its exact body before the first attempt (so a resend after a restart
is byte-identical), and an acknowledgement clears it and counts the batch's
rejected records as lost, atomically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeGuard

import lmdb

from primeruns.exceptions import JournalCorruptError, JournalError
from primeruns.journal.capacity import K_INFLIGHT_PEAK, Capacity
from primeruns.journal.frames import HEADER_SIZE, FrameError, decode_frame, encode_frame
from primeruns.journal.layout import META_KIND, dumps
from primeruns.journal.tail import OwnTail, as_floor
from primeruns.journal.txn import Transactions, bounded_json
from primeruns.journal.types import CursorState, InFlight

# Per sink, the last entry whose damage its shipper counted as lost, written
# with that count: entries read ahead of a batch are counted before any
# acknowledgement passes them, and a process that stops in between must not
# have the next one count them again.
K_DAMAGE_COUNTED = "journal.damage_counted"


def inflight_frame(body: bytes) -> bytes:
    """How an in-flight batch's body is stored (a frame, compressed when that
    helps): made by ``set_inflight``, or beforehand by a caller that has the
    time (``ship.early``: while the batch before is in flight), which hands
    it over as ``frame``. A 5 MB sample-table push takes ~10 ms to compress,
    with the GIL held, between one request's answer and the next request.

    A body whose start does not shrink is stored as it is: Prime Traces'
    bodies are gzip past a few hundred bytes, and zstd spent 2 ms on each
    1 MB of them to save nothing (a frame stored raw reads back the same,
    in every version)."""
    return encode_frame(META_KIND, body, compress=_shrinks(body), level=_INFLIGHT_LEVEL)


# An in-flight body lives until its batch is acknowledged, so it is
# compressed for speed, not size: a 5.5 MB sample-table push took 6.7 ms at
# level 1 (0.082 of its bytes) and takes 5.1 ms at -3 (0.114): ~10 ms of the
# ~50 ms a 2,000-episode evaluation spent framing its bodies, for a few
# hundred KB more kept a moment.
_INFLIGHT_LEVEL = -3
# What ``inflight_frame`` tries zstd on first, and what it must save there.
_PROBE_BYTES = 64 << 10
_PROBE_PAYS = 0.9


def _shrinks(body: bytes) -> bool:
    """Whether zstd makes the first ``_PROBE_BYTES`` of ``body`` smaller by a
    tenth (a body no longer than that: always tried, as a whole)."""
    if len(body) <= _PROBE_BYTES:
        return True
    probe = bytes(body[:_PROBE_BYTES])
    probed = encode_frame(META_KIND, probe, level=_INFLIGHT_LEVEL)
    return len(probed) < HEADER_SIZE + _PROBE_BYTES * _PROBE_PAYS


class Cursors:
    def __init__(self, tx: Transactions, tail: OwnTail, capacity: Capacity) -> None:
        self._tx = tx
        self._tail = tail
        self._capacity = capacity

    def _in(self, txn: lmdb.Transaction, sink: str) -> dict[str, Any]:
        raw = txn.get(sink.encode(), db=self._tx.dbs["cursors"])
        if raw is None:
            return {"acked": 0, "inflight": None}
        where = f"cursor {sink!r} of {self._tx.path}"
        try:
            data = bounded_json(raw)  # an offset and a batch's range: small, unless hostile
        except ValueError as exc:  # FrameError too
            raise JournalCorruptError(f"{where} unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise JournalCorruptError(f"{where} is not an object")
        if not _is_seq(data.get("acked", 0)):
            # Read alone too (the close-out's wait, compaction, ls): an offset
            # ``cursor`` refuses is never taken for a sink's progress there.
            raise JournalCorruptError(f"{where}: its offset is unreadable")
        return data

    def _put(self, txn: lmdb.Transaction, sink: str, data: Mapping[str, Any]) -> None:
        txn.put(sink.encode(), encode_frame(META_KIND, dumps(data)), db=self._tx.dbs["cursors"])

    def cursor(self, sink: str) -> CursorState:
        """The sink's acknowledged offset and in-flight batch (acked=0 if never set)."""
        with self._tx.read() as txn:
            data = self._in(txn, sink)
            body = txn.get(sink.encode(), db=self._tx.dbs["inflight"])
        return self._state(sink, data, body)

    def acked(self, sink: str) -> int:
        """The sink's acknowledged offset alone: its in-flight body (up to a
        whole Parquet object) is not read, for a check made on every wake-up."""
        with self._tx.read() as txn:
            return int(self._in(txn, sink).get("acked", 0))

    def _state(
        self, sink: str, data: Mapping[str, Any], body: bytes | memoryview | None
    ) -> CursorState:
        where = f"cursor {sink!r} of {self._tx.path}"
        acked = data.get("acked", 0)
        info = data.get("inflight")
        if not _is_seq(acked) or not (info is None or _is_range(info, after=acked)):
            # Which entries the sink dealt with is unknown: not guessed at.
            raise JournalCorruptError(f"{where}: its offset or its batch's range is unreadable")
        if info is None:
            return CursorState(acked, None)
        # Missing, it reads as an empty state; any other value that is no map
        # (a falsy one too: 0, "", [], false, null) is damage.
        state = info.get("state", {})
        recorded = info.get("damage")
        damage = None if isinstance(state, dict) else f"its state is {type(state).__name__}"
        payload = b""
        if body is None:
            damage = "its body is missing"
        else:
            try:
                payload = decode_frame(body)[1]
            except FrameError as exc:
                damage = f"its body is damaged: {exc}"
        if recorded is not None:  # found damaged where it was recorded first
            damage = str(recorded)[:500]
        elif damage is not None:
            damage = f"the batch in flight of {where}: {damage}"
        inflight = InFlight(
            info["first_seq"],
            info["last_seq"],
            payload,
            state if isinstance(state, dict) else {},
            damage,
        )
        return CursorState(acked, inflight)

    def offsets(self) -> dict[str, int]:
        """Every sink's acknowledged offset (unreadable cursors left out)."""
        out: dict[str, int] = {}
        with self._tx.read() as txn:
            for raw_key, _ in txn.cursor(db=self._tx.dbs["cursors"]):
                sink = bytes(raw_key).decode(errors="replace")
                try:
                    out[sink] = int(self._in(txn, sink).get("acked", 0))
                except (JournalCorruptError, ValueError, TypeError):
                    continue
        return out

    def furthest(self) -> int:
        """The furthest seq a cursor names (0: none): a sink's acknowledged
        offset, the end of its batch in flight, or the last entry whose
        damage it counted. An append must never reuse one (``Journal``):
        that sink would take the new entry for the one it dealt with."""
        named = [0]
        with self._tx.read() as txn:
            for raw_key, _ in txn.cursor(db=self._tx.dbs["cursors"]):
                sink = bytes(raw_key).decode(errors="replace")
                try:
                    data = self._in(txn, sink)
                except JournalCorruptError:
                    continue
                inflight = data.get("inflight")
                batch_end = inflight.get("last_seq") if isinstance(inflight, dict) else 0
                named += [as_floor(data.get("acked")), as_floor(batch_end)]
            named += [as_floor(mark) for mark in self._damage_marks(txn).values()]
        return max(named)

    def set_inflight(self, sink: str, inflight: InFlight, frame: bytes | None = None) -> None:
        if inflight.first_seq > inflight.last_seq:
            raise ValueError("in-flight range is empty")
        state = dumps(inflight.state)  # JSON-able or fail before writing
        body = inflight_frame(inflight.body) if frame is None else frame
        # The control reserve must hold the in-flight bodies (see Capacity.room_for).
        grew = self._capacity.record_batch(len(body))
        peak = self._capacity.inflight_peak

        def put(txn: lmdb.Transaction) -> None:
            if grew:
                self._tx.put_meta(txn, K_INFLIGHT_PEAK, peak)
            data = self._in(txn, sink)
            data["inflight"] = {
                "first_seq": inflight.first_seq,
                "last_seq": inflight.last_seq,
                "state": json.loads(state),
            }
            if inflight.damage is not None:
                data["inflight"]["damage"] = inflight.damage
            self._put(txn, sink, data)
            if inflight.damage is None:
                txn.put(sink.encode(), body, db=self._tx.dbs["inflight"])
            else:
                # Carried over as damaged (a rehome, a sync journal's
                # hand-over), never as a batch whose empty body is sent: with
                # no body, which the previous version refuses as damage too
                # (it reads no "damage": an empty body was a batch to send).
                txn.delete(sink.encode(), db=self._tx.dbs["inflight"])

        self._tx.write(put)

    def update_inflight_state(self, sink: str, state: Mapping[str, Any]) -> None:
        extra = json.loads(dumps(dict(state)))

        def put(txn: lmdb.Transaction) -> None:
            data = self._in(txn, sink)
            if not data.get("inflight"):
                raise JournalError(f"sink {sink!r} has no batch in flight")
            data["inflight"]["state"] = {**(data["inflight"].get("state") or {}), **extra}
            self._put(txn, sink, data)

        self._tx.write(put)

    def ack(self, sink: str, upto_seq: int, *, failed: int = 0, reason: str | None = None) -> None:
        last = self._tail.last
        if upto_seq > last:
            last = self._tail.readable_end()
            if upto_seq > last:
                raise ValueError(f"cannot ack {upto_seq}: the last entry is {last}")

        def put(txn: lmdb.Transaction) -> None:
            data = self._in(txn, sink)
            if upto_seq < int(data.get("acked", 0)):
                raise ValueError(f"sink {sink!r} already acked {data['acked']} > {upto_seq}")
            self._put(txn, sink, {"acked": upto_seq, "inflight": None})
            txn.delete(sink.encode(), db=self._tx.dbs["inflight"])
            if failed > 0:
                self._tx.add_loss(txn, sink, failed, reason)

        self._tx.write(put)
        self._capacity.acknowledged(self.offsets, self._tail.last)

    def record_loss(
        self, sink: str, count: int, reason: str, *, damaged_through: int | None = None
    ) -> None:
        def put(txn: lmdb.Transaction) -> None:
            self._tx.add_loss(txn, sink, count, reason)
            if damaged_through is not None:
                marks = self._damage_marks(txn)
                marks[sink] = damaged_through
                self._tx.put_meta(txn, K_DAMAGE_COUNTED, marks)

        self._tx.write(put)

    def _damage_marks(self, txn: lmdb.Transaction) -> dict[str, Any]:
        try:
            value = self._tx.meta_or(txn, K_DAMAGE_COUNTED, {})
        except JournalCorruptError:
            value = {}  # damaged itself: written anew (at worst, damage counted again)
        return value if isinstance(value, dict) else {}

    def damage_counted(self, sink: str) -> int:
        """The last entry whose damage ``sink``'s shipper counted (-1: none)."""
        value = self._tx.safe_meta(K_DAMAGE_COUNTED)
        mark = value.get(sink) if isinstance(value, dict) else None
        return mark if isinstance(mark, int) and not isinstance(mark, bool) else -1

    def losses(self) -> dict[str, dict[str, Any]]:
        with self._tx.read() as txn:
            losses = self._tx.losses_in(txn)
        if self._tx.pending_drops:
            rec = losses.setdefault("journal", {"count": 0, "reasons": []})
            rec["count"] = int(rec["count"]) + self._tx.pending_drops
        for rec in losses.values():
            rec.setdefault("reasons", [])
        if "journal" in losses and not losses["journal"]["reasons"]:
            losses["journal"]["reasons"] = ["journal byte budget reached or disk full"]
        return losses


def _is_seq(value: Any) -> TypeGuard[int]:
    """An entry's seq (or 0) as a cursor records one: an int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_range(info: Any, *, after: int) -> bool:
    """A recorded batch's range: first and last seqs, in order, past the
    sink's offset ``after`` (a batch is recorded past what was acknowledged:
    one that reaches back was sent again, or counted lost twice)."""
    if not isinstance(info, dict):
        return False
    first, last = info.get("first_seq"), info.get("last_seq")
    return _is_seq(first) and _is_seq(last) and after < first <= last
