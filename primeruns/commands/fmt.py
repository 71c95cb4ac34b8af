"""Human formatting for the commands: sizes, ages, tables, and colour on a tty only.

Colour is decided per stream: escape codes only when it is a terminal and
``NO_COLOR`` is unset, so piped output and files stay plain text.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

__all__ = ["Style", "human_age", "human_bytes", "table"]


class Style:
    """ANSI colours for one stream, or none when it is not a terminal."""

    def __init__(self, stream: TextIO) -> None:
        isatty = getattr(stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) and not os.environ.get("NO_COLOR")

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def state(self, state: str) -> str:
        """A run state coloured by what it asks of the user."""
        if state in ("shipped",):
            return self.green(state)
        if state in ("crashed", "damaged"):
            return self.red(state)
        if state in ("offline", "finished"):
            return self.yellow(state)
        return state


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover - the loop returns at GB


def human_age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], style: Style) -> str:
    """Left-aligned columns; widths from the plain text (colour codes excluded)."""
    import re

    ansi = re.compile(r"\x1b\[[0-9;]*m")
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(ansi.sub("", cell)))

    def line(cells: Sequence[str]) -> str:
        parts = [c + " " * (widths[i] - len(ansi.sub("", c))) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    out = [style.bold(line(headers))]
    out.extend(line(row) for row in rows)
    return "\n".join(out)
