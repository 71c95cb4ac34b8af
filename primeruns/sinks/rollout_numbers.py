"""How many rollouts of each example the evaluation sample table numbered,
carried from batch to batch in parts that do not grow with the run.

Each episode's rows take the next rollout number of its example (its
summary trace's task index), exactly: the numbering must continue across
batches, restarts of the uplink, replays and syncs of a copy. It was
carried whole, one key per example ever shipped: every batch of a
50,000-example evaluation copied, encoded and saved 50,000 keys three times
(the journal's meta, the batch's ``carry`` and ``carry_before``), ~127 ms a
batch where 1,000 examples cost ~6 ms.

So the numbering is kept in chunks of at most ``CHUNK`` examples (part
``rollouts.<index>``: a list of ``[example, count]`` pairs, which keeps each
example's JSON type), and a batch carries only the chunks it changed: the
shipper saves each part under its own meta key (``Sink.carries_parts``).
Only the open chunk, the last, is ever changed: an example a batch numbers
goes into it, unless it is there already; one of an earlier chunk moves to
it, its count with it, and the count the earlier chunk keeps is lower, so
the next number is the highest count of any part plus one (what reading an
example found in two parts always took). Recording a batch so costs the
chunks its examples fill, a sixteenth of them, whatever the evaluation's
size and order: rollouts of past examples in random order changed a chunk
each, 256 chunks a batch of a large evaluation (4,096 pairs copied, encoded
and saved three times), where a thousand examples have 63 chunks: 3.4 times
the cost at 50,000 examples (``tools/bench/eval_carry.py``). Moved
examples leave stale counts in the parts they left; the batch after the one
that moved them saves each part holding more stale pairs than live ones
again without them (``RolloutBatch.tidied``), so what start-up reads (every
part saved) stays within twice the examples, not a pair per rollout moved:
a dataset repeated once per rollout moves every example each pass. Those
parts are saved with the batch's carry but are not in it: the batch
records (and gives back if refused) only the parts it changed. A batch
tidies ``TIDIED`` parts at most: an earlier version's journal may hold
thousands, which the next batches tidy in turn, not the first alone.

An earlier version's whole numbering (``rollouts``: ``str(example)`` as a
JSON key, to count) is read as the base under the chunks, looked up by the
key it wrote for the example (``"None"``, ``"1.5"``, ``"True"``: read as
anything else, those examples were numbered from 1 again); an example
numbered since is in a chunk, past its base. The saved carry is untrusted input: what of it
cannot be read is left out (those examples number on from what is left),
never raised, so one damaged part costs the numbering of its examples only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..ascii_digits import decimal_or_none

__all__ = ["CHUNK", "TIDIED", "RolloutBatch", "RolloutNumbers"]

# Examples a part holds: a batch of 256 episodes changes at most 17 parts,
# whatever its examples (new, or moved from earlier parts).
CHUNK = 16
# Parts a batch saves again without their stale pairs, at most: as many as
# a batch of 256 can leave holding more stale pairs than live ones (one per
# example it moves on), so tidying keeps up with the batches; a journal an
# earlier version left with thousands (every part of a round-robin pass
# but the last) is tidied over the next batches, not all by the first.
TIDIED = 256
_WHOLE = "rollouts"  # an earlier version's whole numbering
_PART = "rollouts."  # a chunk's part: "rollouts.<index>"
# Past any index a run makes (a part per 16 examples): a damaged or hostile
# part named further on is left out, or the chunks opened after it would be
# named past the journal's longest key and no batch could be saved again.
_MAX_INDEX = 10**15
# Past any count of one example's rollouts a run makes: a damaged or hostile
# count further on is left out, or the next number (one past it) was sent as
# a rollout number no reader of JSON keeps (past 2**64 orjson reads a float,
# past 2**63 it is no 64-bit integer, past 2**53 a double rounds it).
_MAX_COUNT = 10**15
# A part's index or a count written as a digit string: ``str.isdigit`` also
# passes what ``int`` raises on (a superscript two, more digits than it
# reads: its default limit), and one raise lost the whole numbering.
_MOST_DIGITS = 4_300


class RolloutNumbers:
    """The rollouts numbered per example, as the last recorded batch left them."""

    def __init__(self) -> None:
        # An earlier version's carry, under the chunks, by the key it wrote.
        self._base: dict[str, int] = {}
        self._chunks: dict[int, dict[Any, int]] = {}
        self._where: dict[Any, int] = {}  # each example's chunk
        self._open = 0  # the chunk new examples go to (while it has room)
        self._version = 0  # changed by every restore
        # Pairs each part holds as saved, its stale ones too (examples moved
        # on since), and the parts holding more stale pairs than live ones:
        # the next batch saves those again without them (``RolloutBatch.carry``).
        self._sizes: dict[int, int] = {}
        self._untidy: dict[int, None] = {}  # a dict: tidied in a fixed order

    def batch(self) -> RolloutBatch:
        """A batch's numbering, on top of this one (which it leaves unchanged:
        the sink goes on from a batch only once it is recorded)."""
        return RolloutBatch(self)

    def restore(self, carry: Mapping[str, Any]) -> int:
        """Take the parts of ``carry`` (a recorded batch's, the parts saved,
        or an earlier version's whole numbering) over the numbering; how
        many of its items could not be read (left out)."""
        self._version += 1
        if isinstance(carry, _Carry) and carry.batch.adopt_into(self, self._version - 1):
            return 0
        bad = 0
        chunks: dict[int, Any] = {}
        for name, value in carry.items():
            if name == _WHOLE:
                bad += self._set_base(value)
            elif (
                name.startswith(_PART)
                and (index := decimal_or_none(name[len(_PART) :], _MOST_DIGITS)) is not None
            ):
                if index < _MAX_INDEX:
                    chunks[index] = value
                else:
                    bad += 1
        # Every part named is dropped before any is read: an example moved
        # out of one of them is then found in whichever holds it the highest
        # (given every part saved: numbered from them alone, as at start-up).
        for index in chunks:
            self._drop_chunk(index)
        for index, value in chunks.items():
            bad += self._set_chunk(index, value)
            size = len(value) if isinstance(value, list) else int(value is not None)
            if size:
                self._sizes[index] = size
            else:
                self._sizes.pop(index, None)
        self._open = max(self._chunks, default=0)
        # An example read again may have left any part (the higher count
        # stays), so every part is looked at: this restore reads them all
        # (start-up, a batch refused whole) or an earlier batch's carry.
        self._untidy = {}
        for index in self._sizes:
            self._mark(index)
        return bad

    def __len__(self) -> int:
        """How many examples are in chunks (the base left out)."""
        return len(self._where)

    def _mark(self, index: int) -> None:
        """Note part ``index`` for tidying if it holds more stale pairs than
        live ones (saved as more than twice its live examples)."""
        if self._sizes.get(index, 0) > 2 * len(self._chunks.get(index, ())):
            self._untidy[index] = None

    def saved_pairs(self) -> int:
        """How many pairs the saved parts hold, stale ones included: what
        start-up reads (the earlier version's whole numbering left out)."""
        return sum(self._sizes.values())

    def _set_base(self, value: Any) -> int:
        base: dict[str, int] = {}
        bad = 0 if isinstance(value, dict) else 1
        for key, count in value.items() if isinstance(value, dict) else ():
            number = _count(count)
            if number is None:
                bad += 1
            else:
                # Its keys are all ``str(example)``; the max where two are
                # one (a digit string as its own JSON key and an int).
                written = str(key)
                base[written] = max(number, base.get(written, 0))
        self._base = base
        return bad

    def _drop_chunk(self, index: int) -> None:
        for key in self._chunks.pop(index, {}):
            if self._where.get(key) == index:
                del self._where[key]

    def _set_chunk(self, index: int, value: Any) -> int:
        """Make chunk ``index`` hold what ``value`` says (None: nothing, as
        before its first batch), dropped already."""
        chunk: dict[Any, int] = {}
        bad = 0 if value is None or isinstance(value, list) else 1
        for pair in value if isinstance(value, list) else ():
            found = _pair(pair)
            if found is None:
                bad += 1
                continue
            key, number = found
            if chunk.get(key, -1) >= number:
                continue  # named twice in the part (damaged): the higher count stays
            other = self._where.get(key)
            if other is not None and other != index:
                # In two chunks (moved on since, or a damaged journal): the
                # higher count stays, so no number is given twice.
                if self._chunks[other][key] >= number:
                    continue
                del self._chunks[other][key]
            chunk[key] = number
            self._where[key] = index
        if chunk:
            self._chunks[index] = chunk
        return bad


class RolloutBatch:
    """One batch's numbering: the chunks it changed, copied on first change."""

    def __init__(self, numbers: RolloutNumbers) -> None:
        self._numbers = numbers
        self._version = numbers._version
        self._changed: dict[int, dict[Any, int]] = {}
        self._where: dict[Any, int] = {}  # examples this batch put in a chunk (new or moved)
        self._open = numbers._open
        self._tidied: dict[int, int] = {}  # parts saved again without stale pairs: their pairs

    def next_for(self, key: Any) -> int:
        """The number ``key``'s next rollout takes."""
        key = _example(key)
        index = self._where.get(key)
        if index is None:
            index = self._numbers._where.get(key)
        number = None if index is None else self._chunk(index).get(key)
        base = self._numbers._base
        if base:
            # Past the earlier version's count too: an example numbered
            # since is past it already, unless it is one in a dict only
            # (True and 1), which the earlier version wrote apart.
            number = max(number or 0, base.get(str(key), 0))
        return (number or 0) + 1

    def take(self, key: Any, number: int) -> None:
        """``key``'s rollout ``number`` is in the batch."""
        key = _example(key)
        index = self._where.get(key)
        if index is None:
            index = self._numbers._where.get(key)
        if index is None or (index != self._open and index not in self._changed):
            # New, or in a chunk no longer open: into the open chunk (the
            # one it leaves keeps its lower count, never changed again).
            while len(self._chunk(self._open)) >= CHUNK:
                self._open += 1
            index = self._where[key] = self._open
        chunk = self._changed.get(index)
        if chunk is None:
            chunk = self._changed[index] = dict(self._numbers._chunks.get(index, {}))
        chunk[key] = number

    def carry(self) -> dict[str, Any]:
        """The parts the batch changed, as they are after it."""
        carry = _Carry(
            (f"{_PART}{index}", [[_value(key), number] for key, number in chunk.items()])
            for index, chunk in self._changed.items()
        )
        carry.batch = self
        return carry

    def tidied(self) -> dict[str, Any]:
        """Parts holding more stale pairs than live ones, as they were before
        the batch without their stale pairs (None: no pair left), at most
        ``TIDIED`` of them: saved with the batch's carry, but not in it.

        Stale pairs are dropped a batch after the one that moved their
        examples on, never by it: the part an example moved to must be
        saved and recorded first, or a process killed between a batch's
        save and its record could go on from parts that lost the count.
        That batch is acknowledged before this one is recorded (the shipper
        records a batch once the one before is), and nothing goes back
        past an acknowledged batch, so these parts are right whichever way
        this one goes (recorded, killed before its record, refused whole
        and given back, resent after a restart): neither recorded with it
        nor given back, they cost one write, not three (its carry, and
        what it would give back, read first). So the numbering saved stays
        within twice the examples it numbers, and the pairs the last batch
        moved; start-up reads no more."""
        tidied: dict[str, Any] = {}
        self._tidied = {}
        numbers = self._numbers
        for index in numbers._untidy:
            if len(self._tidied) >= TIDIED:
                break  # the rest by the batches after it
            if index not in self._changed:
                live = numbers._chunks.get(index, {})
                pairs = [[_value(key), number] for key, number in live.items()]
                tidied[f"{_PART}{index}"] = pairs or None
                self._tidied[index] = len(pairs)
        return tidied

    def adopt_into(self, numbers: RolloutNumbers, version: int) -> bool:
        """Make ``numbers`` go on from this batch, which it was made on, as
        it stands (``version``): the batch's chunks as they are, not read
        back from its carry (what ``restore`` does otherwise, in the time
        of the parts it changed, each read and checked). False: it was not."""
        if numbers is not self._numbers or version != self._version:
            return False
        for index, pairs in self._tidied.items():
            numbers._untidy.pop(index, None)
            if pairs:
                numbers._sizes[index] = pairs
            else:
                numbers._sizes.pop(index, None)
        for key, index in self._where.items():
            left = numbers._where.get(key)
            if left is not None and left != index:
                # Moved on: its count in the chunk it left is the lower one
                # (still saved there), not kept in memory twice.
                chunk = numbers._chunks.get(left, {})
                chunk.pop(key, None)
                if not chunk:
                    numbers._chunks.pop(left, None)
                numbers._mark(left)
        numbers._chunks.update(self._changed)
        for index, chunk in self._changed.items():
            numbers._sizes[index] = len(chunk)
            numbers._untidy.pop(index, None)
        numbers._where.update(self._where)
        numbers._open = max(numbers._open, self._open)
        return True

    def _chunk(self, index: int) -> dict[Any, int]:
        chunk = self._changed.get(index)
        return self._numbers._chunks.get(index, {}) if chunk is None else chunk


class _Carry(dict[str, Any]):
    """A batch's carry, knowing its batch: handed back to ``restore`` once
    the batch is recorded, it is taken as it is."""

    batch: RolloutBatch


def _pair(pair: Any) -> tuple[Any, int] | None:
    """A part's ``[example, count]`` as read, or None when it is not one."""
    if not isinstance(pair, list) or len(pair) != 2:
        return None
    key, count = pair
    if key is not None and not isinstance(key, str | int | float | list | dict):
        return None
    number = _count(count)
    return None if number is None else (_example(key), number)


class _Nested:
    """An example indexed by a JSON array or object (the row's
    ``example_id`` is whatever the task's ``idx`` is), which a dict cannot
    key: numbered under its canonical JSON text, carried as the value."""

    __slots__ = ("text", "value")

    def __init__(self, value: Any, text: str) -> None:
        self.value = value
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Nested) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __str__(self) -> str:
        return self.text


def _example(key: Any) -> Any:
    """``key`` as the numbering keys it: an array or object by its JSON text."""
    if not isinstance(key, list | dict):
        return key
    try:
        text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        # Not JSON as it is (nested past what json writes): all such share
        # one numbering, which leaves gaps in each, never a number twice.
        text = "\x00unwritable"
    return _Nested(key, text)


def _value(key: Any) -> Any:
    """What a part holds for an example: its index as the record has it."""
    return key.value if isinstance(key, _Nested) else key


def _count(value: Any) -> int | None:
    """A saved count: an int of at least 0 and below ``_MAX_COUNT`` (an
    earlier version wrote ``int(v)`` of what it read: a digit string too),
    else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = decimal_or_none(value, _MOST_DIGITS)
    return value if isinstance(value, int) and 0 <= value < _MAX_COUNT else None
