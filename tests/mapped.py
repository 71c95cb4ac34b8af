"""How much of a mapped file the test process holds resident: the tests of
reads and shipping that must keep a bounded part of a long journal in memory
(LMDB maps the whole file) measure it the same way."""

from __future__ import annotations

from pathlib import Path


def resident_bytes(data: Path) -> int:
    """Bytes of ``data`` resident in this process (its mappings' Rss, from smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                inside = line.rstrip().endswith(str(data))
            elif inside and first == "Rss:":
                total += int(line.split()[1]) * 1024
    return total
