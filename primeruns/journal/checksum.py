"""The CRC-32 every journal frame carries: ISA-L's where isal is installed.

Each entry's checksum is taken over its whole payload three times in its
life: as an append frames it for the spool, as the mover checks that frame
before compressing it, and (over the compressed bytes) as the mover frames
it for LMDB; readers check it once more. zlib's CRC-32 (the table-driven
one of the zlib a Python links) took 5.4 µs of a 9 KB gsm8k episode, ISA-L's
(folding with carry-less multiplies) 1.7 µs: the same function, so the same
bytes in every frame, and frames written by either check out under the
other. isal is a dependency where it has wheels (pyproject's marker);
elsewhere zlib's is used, as before.

``crc32`` is looked up on this module (``checksum.crc32``) and chosen at its
first use (PEP 562): a listing that reads only journals' summaries computes
no checksum, and does not load isal (2-5 ms of its start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zlib import crc32

__all__ = ["crc32"]


def __getattr__(name: str) -> Any:
    if name != "crc32":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from isal.isal_zlib import crc32
    except ImportError:  # a platform isal has no wheel for (the dependency's marker)
        from zlib import crc32
    globals()["crc32"] = crc32  # later lookups find it without this call
    return crc32
