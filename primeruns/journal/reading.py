"""Reading entries: ranges after an offset (what a shipper sends) and single entries.

Entries of kinds a reader did not ask for are skipped by their header, never
decompressed, and damage never raises from ``read``: a damaged entry is
reported and passed over, so one bad page never stops a run's shipping.
"""

from __future__ import annotations

import contextlib
import struct
from bisect import bisect_left
from collections import Counter
from collections.abc import Collection, Sequence

import lmdb

from primeruns.exceptions import JournalCorruptError, JournalError
from primeruns.journal import txn as txn_module
from primeruns.journal.decoding import decode_entries
from primeruns.journal.dicts import Dictionaries
from primeruns.journal.frames import (
    FRAME_VERSIONS,
    HEADER_SIZE,
    EntryKind,
    FrameError,
    peek_header,
    peek_kind,
)
from primeruns.journal.layout import (
    CHUNK_KEY,
    KEY,
    check_entry,
    decode_entry,
    gather,
    key,
    missing,
    seq_of,
    take,
)
from primeruns.journal.spool import SpoolView
from primeruns.journal.tail import K_FLOOR, as_floor, stored_end
from primeruns.journal.txn import Transactions
from primeruns.journal.types import Damage, Entry, ReadResult

# The kind ``tally`` counts an entry under when its header cannot be read (no
# entry kind is 0).
UNREADABLE = 0

# A read examines at most this many entries, so skipping a long run of other
# kinds never holds the lock for long; next_after says where it stopped.
_MAX_SCAN = 50_000
# Looks a count or a single entry's read takes while the mover keeps closing
# segments under it (each close is one segment of SEGMENT_MAX bytes moved).
_LOOKS = 100
# What one look for a single entry is counted as read of the map (see
# Transactions.count_read): Linux maps up to 64 KiB of cached file around each
# page fault (fault_around_bytes), and a look faults on a few pages.
_LOOK_PAGES_BYTES = 64 << 10
# ``tally``'s range end when it has none: past every seq a key can hold.
_NO_END = 1 << 64
# A frame header's raw length (its bytes 4..7).
_RAW_LEN = struct.Struct("<I")


class Reader:
    def __init__(
        self,
        tx: Transactions,
        dicts: Dictionaries,
        floor: int,
        spool: SpoolView,
        *,
        sole_compactor: bool,
    ) -> None:
        self._tx = tx
        self._dicts = dicts
        self.spool = spool  # the log's newest entries, not yet in LMDB
        self.floor = floor  # entries up to here were compacted away
        # Whether this process is the only one that compacts (a live run's
        # uplink); elsewhere (a read-only view, a producer) the floor is read
        # again before each read.
        self.sole_compactor = sole_compactor

    def floor_now(self) -> int:
        if not self.sole_compactor:
            self.floor = max(self.floor, as_floor(self._tx.safe_meta(K_FLOOR)))
        return self.floor

    def read(
        self,
        after_seq: int,
        *,
        kinds: Collection[EntryKind] | None = None,
        max_entries: int = 1000,
        max_bytes: int = 8 << 20,
        max_entry_bytes: int | None = None,
        decode: bool = True,
        frames: bool = False,
    ) -> ReadResult:
        """Entries after ``after_seq`` of the given kinds, copied out, ascending.

        Stops at ``max_entries`` or ``max_bytes`` of payload (at least one
        matching entry is returned if any exists, unless a scan's limit
        comes first: 50,000 entries looked at, or ``REMAP_AFTER_BYTES`` of
        others passed over; ``next_after`` then says where it stopped).
        Damaged entries are reported in ``damaged`` and passed over. An
        entry declaring more than ``max_entry_bytes`` is listed in
        ``oversized`` (it counts towards ``max_entries``), never copied or
        decompressed: ``0`` reads headers only, and lists every entry there,
        one of no bytes too.
        ``decode=False`` checks each entry (``check_entry``: its checksum, no
        decompression) and lists those that pass in ``checked``, not in
        ``entries``: a damage scan's cheap form. ``frames``: each entry's
        stored frame too (``ReadResult.frames``).
        """
        for _ in range(_LOOKS - 1):
            result = self._read_once(
                after_seq, kinds, max_entries, max_bytes, max_entry_bytes, decode, frames
            )
            if result is not None:
                return result
        # The mover closed a segment under every look: what LMDB held (the
        # spool's part comes at the next read).
        short = self._read_once(
            after_seq,
            kinds,
            max_entries,
            max_bytes,
            max_entry_bytes,
            decode,
            frames,
            trust_short=True,
        )
        assert short is not None
        return short

    def _read_once(
        self,
        after_seq: int,
        kinds: Collection[EntryKind] | None,
        max_entries: int,
        max_bytes: int,
        max_entry_bytes: int | None,
        decode: bool,
        keep_frames: bool = False,
        *,
        trust_short: bool = False,
    ) -> ReadResult | None:
        """One look at LMDB then the spool; None when the mover closed a
        segment between the two (``spool``), whose entries this look saw in
        neither: a read that came back short then had a caller that waits
        for a wake-up (the uplink's look for the producer's finish) sleep
        with the entry there, once for 300 s. ``trust_short``: return what
        LMDB held anyway."""
        wanted = None if kinds is None else frozenset(int(k) for k in kinds)
        raw: list[tuple[int, bytes]] = []
        damaged: list[Damage] = []
        oversized: list[tuple[int, int, int]] = []
        checked: list[tuple[int, int]] = []
        cap = max_entry_bytes
        # 0 reads headers only: an entry of no bytes (a header alone) is not
        # over a limit of none, and was read whole instead, listed nowhere by
        # a reader of headers (``by_kind.seqs_by_kind``).
        headers_only = cap == 0
        next_after = after_seq
        total = 0
        floor = self.floor_now()
        spool = self.spool
        spool.refresh()  # before LMDB's read: see spool
        forgotten = spool.forgotten
        expected = after_seq + 1
        examined = 0
        full = False
        in_lmdb = -1  # LMDB's end as this read saw it (-1: unread, so no spool)
        touched = 0  # bytes of the map this read went over (an overestimate)
        kept = 0  # of them, those of the entries it takes (bounded by ``max_bytes``)
        cut = False  # stopped at a scan's limit, short of LMDB's end
        try:
            with self._tx.read(buffers=True) as txn:
                in_lmdb = stored_end(self._tx, txn)
                cur = txn.cursor(db=self._tx.dbs["entries"])
                more = cur.set_range(key(expected))
                # The loop runs once per entry of a read: what it calls is
                # bound to locals.
                key_8, chunk_key_size, unpack_key = KEY.size, CHUNK_KEY.size, KEY.unpack
                unpack_len, versions = _RAW_LEN.unpack_from, FRAME_VERSIONS
                while more:
                    # A scan's limits: the entries looked at, and the bytes
                    # of those passed over. A value handed out is paged in
                    # whole, one passed over by its header too, and stays
                    # resident until the transaction ends (the map is
                    # dropped between two): a read of a few metric rows
                    # among large episodes held them all.
                    if examined >= _MAX_SCAN or touched - kept >= txn_module.REMAP_AFTER_BYTES:
                        cut = True
                        break
                    raw_key, value = cur.item()
                    touched += len(value)
                    key_size = len(raw_key)
                    if key_size == chunk_key_size and seq_of(raw_key) < expected:
                        more = cur.next()  # a chunk of an entry passed over
                        continue
                    # Not an entry's own key (``layout.is_entry_key``, inline: every entry).
                    if key_size != key_8 or raw_key[0] >= 0x80:
                        damaged.append(Damage(None, f"malformed entry key {bytes(raw_key).hex()}"))
                        more = cur.next()
                        continue
                    seq = unpack_key(raw_key)[0]
                    if seq > expected and expected > floor:
                        damaged.append(missing(expected, seq - 1))
                    expected = seq + 1
                    examined += 1
                    # The header's kind and length, read in place (what
                    # ``peek_header`` checks, without its named tuple);
                    # ``peek_header`` words the damage of one that fails.
                    if len(value) < HEADER_SIZE or value[0] not in versions:
                        try:
                            peek_header(value)
                        except FrameError as exc:
                            damaged.append(Damage(seq, f"entry {seq}: {exc}"))
                        next_after = seq
                        more = cur.next()
                        continue
                    kind, raw_len = value[1], unpack_len(value, 4)[0]
                    if wanted is None or kind in wanted:
                        # Not copied: no bytes.
                        over = headers_only or (cap is not None and raw_len > cap)
                        # Those checked in place count as those copied out:
                        # every page gone over stays resident until the
                        # transaction ends (a scan of a few large entries
                        # held the whole journal).
                        taken = len(raw) + len(checked)
                        if taken + len(oversized) >= max_entries or (
                            taken and not over and total + raw_len > max_bytes
                        ):
                            # Every seq before this one was looked at: a gap
                            # just before it is reported, so the read is past
                            # it (acknowledged with the batch, not met again).
                            next_after = max(next_after, seq - 1)
                            full = True
                            break
                        if over:
                            oversized.append((seq, kind, raw_len))
                            next_after = seq
                            more = cur.next()
                            continue
                        total += raw_len
                        if not decode:
                            # Checked in place, uncopied: most entries are one
                            # value. A chunked one (or one needing a dictionary
                            # not loaded yet) fails here, and is checked whole
                            # below.
                            kind, damage = check_entry(seq, value, self._dicts.cached)
                            if damage is None:
                                checked.append((seq, kind))
                                kept += len(value)
                                next_after = seq
                                more = cur.next()
                                continue
                        kept += len(value)
                        # Copied out with its chunks; the cursor ends on the
                        # key the loop looks at next.
                        whole, more = take(cur, seq, value)
                        raw.append((seq, whole))
                        next_after = seq
                        continue
                    next_after = seq
                    more = cur.next()
        except (lmdb.Error, JournalCorruptError) as exc:
            damaged.append(Damage(None, f"reading after entry {next_after} failed: {exc}"))
        # The look down the tree to the first key faults pages in around it
        # as a single entry's does (``get``): 2,000 reads of one small row
        # each counted only their rows and never dropped the map.
        self._tx.count_read(_LOOK_PAGES_BYTES + touched)
        if in_lmdb >= 0 and not full and not cut and examined < _MAX_SCAN:
            # The log goes on in the spool, past what LMDB holds.
            expected = max(expected, in_lmdb + 1)
            with spool.lock:
                # A segment closed since LMDB's read was moved into LMDB
                # meanwhile (see spool): read again, where LMDB holds them.
                if spool.forgotten != forgotten and not trust_short:
                    return None
                frames = spool.frames(expected - 1) if spool.forgotten == forgotten else ()
                for seq, kind, size, seg, index in frames:
                    if examined >= _MAX_SCAN:
                        break
                    if seq > expected and expected > floor:
                        damaged.append(missing(expected, seq - 1))
                    expected = seq + 1
                    examined += 1
                    if wanted is None or kind in wanted:
                        raw_len = size - HEADER_SIZE
                        over = headers_only or (cap is not None and raw_len > cap)
                        taken = len(raw) + len(checked)
                        if taken + len(oversized) >= max_entries or (
                            taken and not over and total + raw_len > max_bytes
                        ):
                            next_after = max(next_after, seq - 1)  # as in LMDB's
                            break
                        if over:
                            oversized.append((seq, kind, raw_len))
                            next_after = seq
                            continue
                        try:
                            raw.append((seq, spool.read(seg, index)))
                        except JournalError as exc:
                            damaged.append(Damage(seq, f"entry {seq}: {exc}"))
                        total += raw_len
                    next_after = seq
                else:
                    # Read to the log's end. A later segment holding no whole
                    # append still names its first seq: the seqs before it
                    # that no frame held are missing (damage cut its
                    # predecessor short), reported and passed as any gap.
                    named = spool.named_after(expected - 1) if spool.forgotten == forgotten else 0
                    if named >= expected:
                        if expected > floor:
                            damaged.append(missing(expected, named))
                        expected, next_after = named + 1, max(next_after, named)
                    # Entries damage cost the newest segment come after it,
                    # where no later entry reports them as missing
                    # (``spool``). Reported, not passed: their seqs may yet
                    # be written, by a sync journal's import of the same
                    # entries (a new owner's appends start past them:
                    # ``Journal._appends_after``).
                    lost = spool.lost_after(expected - 1) if spool.forgotten == forgotten else None
                    if lost is not None and expected > floor:
                        damaged.append(lost)
        entries: list[Entry] = []
        stored: dict[int, bytes] = {}
        if decode:
            decode_entries(raw, self._dicts.get, entries, damaged, stored if keep_frames else None)
        for seq, value in () if decode else raw:
            kind, damage = check_entry(seq, value, self._dicts.get)
            if damage is not None:
                damaged.append(damage)
            else:
                checked.append((seq, kind))
        checked.sort()  # those checked whole come after those checked in place
        return ReadResult(entries, next_after, damaged, oversized, checked, stored)

    def tally(
        self, cuts: Sequence[int] = (), *, past: int = 0, upto: int | None = None
    ) -> list[Counter[int]]:
        """Entries present per kind in each interval the ascending ``cuts`` make:
        ``(0, c1], (c1, c2], ..., (cn, end]``, by header alone (nothing is
        decompressed). An entry whose header cannot be read counts under
        ``UNREADABLE``: it is still there, unshipped (``read`` reports it).
        The scan goes in bounded read transactions, so a long journal never
        pins a live writer's old pages for long. ``past``: only the entries
        after it are looked at (those up to it count nowhere), so a count of
        what is left past an offset costs what is left, not the log's length.
        ``upto``: nor after it (those past it count nowhere), so a count of
        one range (a batch's, what a sink has left of a target) costs the
        range, however long the log has grown past it."""
        bounds = sorted(set(cuts))
        end = _NO_END if upto is None else upto
        for _ in range(_LOOKS):
            counts: list[Counter[int]] = [Counter() for _ in range(len(bounds) + 1)]
            self.spool.refresh()  # before LMDB's reads: see spool
            forgotten = self.spool.forgotten
            # The highest seq counted in LMDB (with its compaction floor, and
            # ``past``: the spool's count starts after it).
            seen = [max(past, 0)]
            resume: bytes | None = key(seen[0] + 1 if past > 0 else 0)
            while resume is not None:
                resume = self._tally_some(resume, bounds, counts, seen, end)
            with self.spool.lock:
                if self.spool.forgotten != forgotten:
                    continue  # moved into LMDB meanwhile (see spool): count again
                for seq, kind, _, _, _ in self.spool.frames(seen[0]):
                    if seq > end:
                        break
                    counts[bisect_left(bounds, seq)][kind] += 1
                return counts
        raise JournalError(f"{self._tx.path}: the log kept moving while it was counted")

    def _tally_some(
        self,
        start: bytes,
        bounds: list[int],
        counts: list[Counter[int]],
        seen: list[int],
        end: int,
    ) -> bytes | None:
        """One transaction of ``tally``: where the next should start, or None at the end."""
        touched = [0]
        try:
            return self._tally_in(start, bounds, counts, seen, touched, end)
        finally:
            self._tx.count_read(touched[0])

    def _tally_in(
        self,
        start: bytes,
        bounds: list[int],
        counts: list[Counter[int]],
        seen: list[int],
        touched: list[int],
        end: int,
    ) -> bytes | None:
        with self._tx.read(buffers=True) as txn:
            # What the spool's count starts after: the floor (compacted away,
            # counted apart) and each seq counted here, never LMDB's end as
            # this transaction sees it (entries the mover committed after an
            # earlier pass would then be counted nowhere).
            with contextlib.suppress(JournalCorruptError):
                seen[0] = max(seen[0], as_floor(self._tx.meta_or(txn, K_FLOOR, 0)))
            cur = txn.cursor(db=self._tx.dbs["entries"])
            if not cur.set_range(start):
                return None
            # The loop runs once per entry of the log (a close-out counts
            # what each sink has left, its summary what the run logged):
            # what it reads is bound to locals, and the running values are
            # written back once, however it ends.
            index, last = 0, len(bounds)
            here = counts[0]
            nbytes, top = touched[0], seen[0]
            most, most_bytes = _MAX_SCAN, txn_module.REMAP_AFTER_BYTES
            key_size, unpack, kind_of = KEY.size, KEY.unpack, peek_kind
            try:
                for examined, (raw_key, value) in enumerate(cur.iternext()):
                    # Ended past what is dropped between two transactions: a
                    # value's pages stay resident until its transaction ends,
                    # and one went over a journal of a few large entries whole.
                    if examined >= most or nbytes >= most_bytes:
                        return bytes(raw_key)
                    if len(raw_key) != key_size:
                        continue  # a chunk of the entry before it
                    seq = unpack(raw_key)[0]
                    if seq > end:
                        # Past the range: the spool's count starts after
                        # this seq too, as it would after a scan to LMDB's
                        # end (which reaches at least this far).
                        top = max(top, seq)
                        return None
                    nbytes += len(value)
                    while index < last and seq > bounds[index]:
                        index += 1
                        here = counts[index]
                    kind = kind_of(value)
                    here[UNREADABLE if kind is None else kind] += 1
                    if seq > top:
                        top = seq
            finally:
                touched[0], seen[0] = nbytes, top
        return None

    def reads_in(self, txn: lmdb.Transaction, seq: int, value: bytes | memoryview) -> bool:
        """Whether entry ``seq``, whose first stored value ``value`` is (at
        ``txn``'s cursor on the entries), reads whole: its chunks in order,
        its checksum, its dictionary."""
        cur = txn.cursor(db=self._tx.dbs["entries"])
        if not cur.set_key(key(seq)):
            return False
        whole, ordered = gather(cur, seq, value)
        return ordered and check_entry(seq, whole, lambda i: self._dicts.get(i, txn))[1] is None

    def get(self, seq: int) -> Entry | None:
        """The entry ``seq``, or None if absent; JournalCorruptError if damaged."""
        for _ in range(_LOOKS):
            found, value = self._find(seq)
            if found:
                break
        else:
            raise JournalError(f"{self._tx.path}: the log kept moving while entry {seq} was read")
        # A look down the tree touches a few pages beside the value's own.
        self._tx.count_read(_LOOK_PAGES_BYTES + (0 if value is None else len(value)))
        if value is None:
            return None
        entry, damage = decode_entry(seq, value, self._dicts.get)
        if damage is not None:
            raise JournalCorruptError(f"{self._tx.path}: {damage.what}")
        return entry

    def _find(self, seq: int) -> tuple[bool, bytes | None]:
        """(whether the look holds: no segment closed between LMDB's read and
        the spool's, see spool; the entry's stored value, None if absent)."""
        self.spool.refresh()  # before LMDB's read: see spool
        forgotten = self.spool.forgotten
        with self._tx.read() as txn:
            in_lmdb = stored_end(self._tx, txn)
            cur = txn.cursor(db=self._tx.dbs["entries"])
            value: bytes | None = None
            if cur.set_key(key(seq)):
                value, _ = gather(cur, seq, cur.value())
        if value is None and seq > in_lmdb:
            with self.spool.lock:
                if self.spool.forgotten != forgotten:
                    return False, None
                for found, _, _, seg, index in self.spool.frames(seq - 1):
                    if found == seq:
                        try:
                            value = self.spool.read(seg, index)
                        except JournalError as exc:
                            raise JournalCorruptError(
                                f"{self._tx.path}: entry {seq}: {exc}"
                            ) from None
                    break
        return True, value
