"""A copy's original on this host, asked which entries it holds intact.

A copy of a journal whose producer is gone from this host is final (what
it lacks or holds damaged is lost for good) only where its original, here
beside it, holds no more. Files copied at different moments while the
producer wrote (``data.mdb`` before the mover moved a spool segment into it
and deleted it, the segment after) leave a copy missing entries in its
middle, and a bit flipped in transfer leaves one damaged: taken as final,
they were passed over and counted lost, and no later copy brought them
(the sync journal had gone past), though the original held every one.

The original is only read, never written (its producer is gone; a sync of
it ships through the same sync journal). It is opened once, on the first
question, and kept open until the import that asks ends: opening it walks
its tree in a child first, and a final copy's import asks at every gap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from ..exceptions import JournalError
from ..journal import Journal
from ..journal.origin import Origin

__all__ = ["OriginalHere"]


class OriginalHere:
    """The original ``origin`` names (None: no original here to ask, as
    where its producer's state is not ``dead``), read-only. Not thread-safe:
    one import asks it."""

    def __init__(self, origin: Origin | None) -> None:
        self._origin = origin
        self._journal: Journal | None = None
        self._unreadable = origin is None

    def holds(self, seqs: Iterable[int]) -> bool:
        """Whether the original holds one of ``seqs`` intact. One damaged
        there too is not held: that damage is lost for good. An original
        that cannot be read holds nothing: the copy is all there is."""
        original = self._open()
        if original is None:
            return False
        for seq in seqs:
            with contextlib.suppress(JournalError):  # damaged there too
                if original.get(seq) is not None:
                    return True
        return False

    def _open(self) -> Journal | None:
        if self._journal is None and not self._unreadable:
            assert self._origin is not None
            try:
                self._journal = Journal.open(Path(self._origin.path), owner=False)
            except JournalError:
                self._unreadable = True
        return self._journal

    def close(self) -> None:
        """Close the original if it was opened (``contextlib.closing``)."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
