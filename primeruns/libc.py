"""The C library, for the few calls Python does not wrap (``statfs``'s
filesystem type, ``malloc_trim``, ``mallopt``).

Opened by its usual name first: ``ctypes.util.find_library("c")`` runs
``ldconfig -p`` (and may run a compiler) in a child process, a fork and an
exec that cost every ``init()`` 7-25 ms on a loaded 2-core machine (the
journal's network filesystem check asked for it each time); it is asked
only where that name does not load (a libc other than glibc's). Opened once
per process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["libc"]

_USUAL = "libc.so.6"  # glibc's soname on Linux


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library (``use_errno``); raises OSError where none loads."""
    try:
        return ctypes.CDLL(_USUAL, use_errno=True)
    except OSError:
        found = ctypes.util.find_library("c")
        if found is None:
            raise
        return ctypes.CDLL(found, use_errno=True)
