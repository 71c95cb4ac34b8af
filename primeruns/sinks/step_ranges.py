"""Which ``sample_id`` range each step of the training sample table takes
next, in state that does not grow with the run.

Every Parquet object of a step is numbered in a range of its own (range
index << 32), so two objects of one step (its episodes split over two
batches, or logged late) never share a sample id. The sink carries the
numbering from batch to batch in the journal (``Prepared.carry``), and it
was one key per step ever shipped: a 100,000-step run re-encoded thousands
of keys for every object, and the uplink kept them all.

Only uniqueness matters: a range index a step never used is as good as the
one after its last. So the last ``WINDOW`` steps used are kept exactly, and
the steps before them fold into one bound: every folded step takes its next
range at or above the highest next index any of them had. A late episode of
an old step then gets a fresh range, never a used one, and the state is
``WINDOW`` keys plus two numbers, whatever the run's length.

The stored form keeps the key earlier versions wrote (``ranges``, step to
next index, now only the recent steps) and adds ``ranges_folded`` (``[the
highest folded step, the bound]``): a journal of an earlier version restores
here, its long ``ranges`` folded at once.

A process draws a step's ranges from a ``Block``: ranks of one run log the
same steps at once, each from its own block of indexes, the next rank's
right after it. Past the end of its block a rank goes on far from every
rank's block (``Block.then``), never into the next rank's: a rank making
more objects of one step than its block holds (an asynchronous trainer
shipping each rollout as it comes, rollouts of two steps interleaved) gave
its objects the sample ids of the next rank's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["WINDOW", "Block", "StepRanges"]

WINDOW = 64  # steps kept exactly: an asynchronous trainer's stragglers are this recent
# Where the indexes drawn far from every rank's block begin (``ship.uplink``).
FAR = 1 << 20


@dataclass(frozen=True)
class Block:
    """The range indexes a process numbers a step's objects from: from
    ``start``; where another process's block follows (``end``, not None), on
    from ``then`` past it."""

    start: int = 0
    end: int | None = None
    then: int = 0


class StepRanges:
    """The next range index per step: exact for recent steps, bounded for older ones."""

    def __init__(self, block: Block | None = None) -> None:
        self._block = block or Block()
        # A forked child's base is far from its parent's, so it never reuses them.
        self._base = self._block.start
        self._recent: dict[int, int] = {}
        self._folded_step = -1  # every step at or below it not in _recent is folded
        self._folded_next = 0  # a folded step's next index is at least this

    def next_for(self, step: int) -> int:
        """The range index ``step``'s next object takes."""
        found = self._recent.get(step)
        if found is not None:
            return found
        if step <= self._folded_step:
            return max(self._base, self._folded_next)
        return self._base

    def used(self, step: int, index: int) -> StepRanges:
        """A copy in which ``step`` used range ``index`` (this one unchanged: the
        sink goes on from it only once the batch is recorded)."""
        after = index + 1
        if after == self._block.end:  # the next process's block: on far from it
            after = self._block.then
        out = StepRanges(self._block)
        out._recent = {**self._recent, step: after}
        out._folded_step, out._folded_next = self._folded_step, self._folded_next
        out._fold()
        return out

    def _fold(self) -> None:
        """Fold the oldest steps past the window into the bound."""
        if len(self._recent) <= WINDOW:
            return
        for step in sorted(self._recent)[: len(self._recent) - WINDOW]:
            self._folded_next = max(self._folded_next, self._recent.pop(step))
            self._folded_step = max(self._folded_step, step)

    def to_carry(self) -> dict[str, Any]:
        carry: dict[str, Any] = {"ranges": {str(k): v for k, v in self._recent.items()}}
        if self._folded_step >= 0:
            carry["ranges_folded"] = [self._folded_step, self._folded_next]
        return carry

    @classmethod
    def from_carry(cls, carry: Mapping[str, Any], block: Block | None = None) -> StepRanges:
        """The numbering a batch carried (this version's form or an earlier
        one's); ValueError or TypeError when it is damaged."""
        out = cls(block)
        ranges = carry.get("ranges")
        if isinstance(ranges, dict):
            out._recent = {int(k): int(v) for k, v in ranges.items()}
        folded = carry.get("ranges_folded")
        if folded is not None:
            step, bound = folded  # a damaged value raises: the shipper renumbers
            out._folded_step, out._folded_next = int(step), int(bound)
        # An earlier version went on from a block's end into the next one's:
        # a carry of its numbering there goes on far instead.
        out._recent = {k: out._off_others(v) for k, v in out._recent.items()}
        out._folded_next = out._off_others(out._folded_next)
        out._fold()
        return out

    def _off_others(self, index: int) -> int:
        """``index``, or this block's far place if it lies in a later block."""
        end = self._block.end
        return self._block.then if end is not None and end <= index < FAR else index

    def __len__(self) -> int:
        """How many steps are kept exactly (at most ``WINDOW``)."""
        return len(self._recent)
