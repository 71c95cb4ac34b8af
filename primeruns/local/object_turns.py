"""Turns on an object of the store: a PUT and a confirm of one key never overlap.

Confirm checks an object's file (its rows and decoded size, off the event
loop when it has to decode it) and then marks the object confirmed; a PUT
to the same presigned URL landing between the two replaced the checked file
with one never checked, and that one was marked confirmed. Each takes the
key's turn for its read-check-write, on the server's one event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["ObjectTurns"]


class ObjectTurns:
    """One lock per object key in use, on the server's event loop: a PUT
    writing an object and a confirm checking then marking it never overlap."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        lock, users = self._held.get(key, (asyncio.Lock(), 0))
        self._held[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._held[key]
            if users == 1:
                del self._held[key]  # none waits: what is kept is what is in use
            else:
                self._held[key] = (lock, users - 1)
