"""Unicode sparklines: a metric's curve over steps in one line of a terminal.

Many steps are resampled into ``width`` buckets (each the mean of its steps),
so a 10,000-step run still fits; non-finite values show as a gap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["BLOCKS", "sparkline"]

BLOCKS = "▁▂▃▄▅▆▇█"


def _buckets(values: Sequence[float], width: int) -> list[float]:
    if len(values) <= width:
        return list(values)
    out: list[float] = []
    for i in range(width):
        lo, hi = i * len(values) // width, (i + 1) * len(values) // width
        chunk = [v for v in values[lo:hi] if math.isfinite(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def sparkline(values: Sequence[float], width: int = 48) -> str:
    """One block character per value (or bucket): low to high, ``' '`` for NaN/inf."""
    points = _buckets(values, max(1, width))
    finite = [v for v in points if math.isfinite(v)]
    if not finite:
        return " " * len(points)
    lo, hi = min(finite), max(finite)
    span = hi - lo
    chars = []
    for v in points:
        if not math.isfinite(v):
            chars.append(" ")
        elif span == 0:
            chars.append(BLOCKS[len(BLOCKS) // 2])
        else:
            chars.append(BLOCKS[min(len(BLOCKS) - 1, int((v - lo) / span * len(BLOCKS)))])
    return "".join(chars)
