"""Bytes shared by a producer and its uplink: which entry kinds the uplink waits for.

The producer wakes its uplink with a byte on a pipe after an append. Under
load that write is not free: in the loop benchmark (2 cores, the uplink and
the local platform busy beside the loop) the slowest steps spent 2-5 ms in
that one-byte write, the uplink woken while it was shipping or lingering
anyway. So each of the uplink's shippers raises the flags of its kinds just
before it waits for new entries (``listening``), and the producer writes the
byte only when the kind it appended is raised (``answer``, which lowers them
all: every waiter wakes, and those still waiting raise theirs again), or when
enough entries wait in the staging table for the uplink to compress them
(``link.UplinkProcess.wake``). A shipper of metrics rows is not woken by
episodes, nor the one of episodes by each metrics row.

The flags live in a memfd both processes map, one byte per kind. A shipper raises it, then reads
the journal's end once more before it sleeps; the producer commits its append,
then looks at the flag. Each side's store and later load are separated by
locked instructions (the GIL's and LMDB's mutexes), so at least one of them
sees the other's store: either the shipper finds the entry, or the producer
finds the flag. Should a wake-up still be missed, the shipper looks at the
journal again within a second; nothing is lost either way.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Collection

_SIZE = 64  # one byte per entry kind (EntryKind values are small)


class Doorbell:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _SIZE)

    @classmethod
    def create(cls) -> Doorbell | None:
        """A new flag (lowered), or None where memfds are not available."""
        try:
            fd = os.memfd_create("primeruns-doorbell")
        except (AttributeError, OSError):
            return None
        try:
            os.ftruncate(fd, _SIZE)
            return cls(fd)
        except (OSError, ValueError):
            os.close(fd)
            return None

    def listening(self, kinds: Collection[int] | None) -> None:
        """The uplink's side: about to wait for new entries of ``kinds`` (None: any)."""
        for kind in range(1, _SIZE) if kinds is None else kinds:
            if 0 < kind < _SIZE:
                self._map[kind] = 1

    def answer(self, kind: int) -> bool:
        """The producer's side, after appending ``kind``: whether to ring
        (the uplink waits for it); lowers every flag when it does."""
        if 0 < kind < _SIZE and not self._map[kind]:
            return False
        self._map[:] = bytes(_SIZE)
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError, BufferError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
