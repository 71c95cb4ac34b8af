"""The progress line of ``replay``/``sync``: records and bytes shipped, pending per sink.

On a terminal it redraws one line in place (at most ~10 times a second); on a
pipe or a file it prints only the final state, so logs stay readable.
"""

from __future__ import annotations

import time
from typing import TextIO

from ..ship.uplink import Progress
from .fmt import Style, human_bytes

__all__ = ["ProgressLine"]


class ProgressLine:
    def __init__(self, stream: TextIO, label: str) -> None:
        self._stream = stream
        self._label = label
        self._live = Style(stream).enabled
        self._last_draw = 0.0
        self._last: Progress | None = None

    def _text(self, p: Progress) -> str:
        pending = ", ".join(f"{k} {v}" for k, v in sorted(p.pending.items()) if v)
        tail = f"; pending: {pending}" if pending else ""
        return f"  {self._label}: {p.records} records, {human_bytes(p.bytes)}{tail}"

    def __call__(self, progress: Progress) -> None:
        self._last = progress
        now = time.monotonic()
        if self._live and now - self._last_draw >= 0.1:
            self._last_draw = now
            self._stream.write("\r\x1b[K" + self._text(progress))
            self._stream.flush()

    def done(self) -> None:
        if self._last is None:
            return
        prefix = "\r\x1b[K" if self._live else ""
        self._stream.write(prefix + self._text(self._last) + "\n")
        self._stream.flush()
