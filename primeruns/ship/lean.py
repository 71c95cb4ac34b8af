"""What a shipping process leaves unimported: optional packages that its
libraries would load for nothing.

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
those libraries handle.

pyarrow, which a training run's sample table loads, imports numpy wherever
it is installed: ~65 ms of the ~115 ms of CPU its import takes, in every
uplink and ``primeruns sync`` of a training run. The sample table hands
pyarrow Python rows, never a numpy object, and pyarrow goes without numpy
from version 18 on (earlier ones fail to import without it: there numpy is
left alone). The Parquet objects are the same bytes either way.

Only in a process that ships and runs no user code: the uplink process
(``mark_absent`` is called from its ``__main__``) and the ``replay`` and
``sync`` commands run as a program (``cli.main``); a user's own process
may use any of them.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

__all__ = ["UNUSED", "mark_absent", "pyarrow_needs_numpy"]

#: Optional packages (and httpx's CLI module) that nothing the uplink runs uses.
UNUSED = ("httpx._main", "trio", "anyio")
#: The first pyarrow that imports without numpy (apache/arrow#41904).
_PYARROW_WITHOUT_NUMPY = 18
# How pyarrow's build records its version (setuptools_scm's file in the package).
_VERSION = re.compile(r"""^(?:__version__\s*=\s*)?version\s*=\s*['"](\d+)\.""", re.MULTILINE)


def mark_absent() -> None:
    """Mark ``UNUSED`` as not installed in this process, where none is
    imported yet (one already loaded is left as it is), and numpy too
    where the pyarrow installed goes without it."""
    for name in UNUSED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    if not pyarrow_needs_numpy():
        sys.modules.setdefault("numpy", None)  # type: ignore[arg-type]


def pyarrow_needs_numpy() -> bool:
    """Whether the pyarrow installed would fail to import without numpy,
    told from its version file without importing it; True when that
    cannot be told (numpy is then left alone). False without pyarrow."""
    try:
        spec = importlib.util.find_spec("pyarrow")
    except (ImportError, ValueError):
        return True
    if spec is None:
        return False
    for folder in spec.submodule_search_locations or ():
        try:
            text = (Path(folder) / "_generated_version.py").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found = _VERSION.search(text)
        if found is not None:
            return int(found.group(1)) < _PYARROW_WITHOUT_NUMPY
    return True
