"""What the uplink process leaves unimported: optional packages that its
HTTP library would load for nothing.

httpx imports its command-line client (click, pygments, rich) wherever those
are installed, and httpcore imports trio and anyio for its async locks
wherever they are; trio's import even runs ``ldconfig -p`` in a child
process (``ctypes.util.find_library``), a fork of the uplink. Together
about 70 ms of CPU in every uplink, paid by every run however short (a
tenth of its start-up's CPU and more; ``tools/bench/end_to_end.py``). The
uplink sends from threads (``http.client``, else httpx's synchronous client) only, never runs
httpx's command line, and runs no user code, so it marks these modules
absent before httpx is imported: ``None`` in ``sys.modules`` is what the
import system reports as not installed (an ``ImportError``), the very case
those libraries handle. Only in the uplink process (``mark_absent`` is
called from its ``__main__``): a user's own process may use any of them.
"""

from __future__ import annotations

import sys

__all__ = ["UNUSED", "mark_absent"]

#: Optional packages (and httpx's CLI module) that nothing the uplink runs uses.
UNUSED = ("httpx._main", "trio", "anyio")


def mark_absent() -> None:
    """Mark ``UNUSED`` as not installed in this process, where none is
    imported yet (one already loaded is left as it is)."""
    for name in UNUSED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
