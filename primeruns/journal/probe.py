"""Read a journal's whole LMDB tree in a child process before this one maps it.

LMDB has no page checksums and trusts its file: a page of the wrong type in
the middle of a tree (one zeroed page is enough) makes it fail an assertion
in C and abort the process (``mdb.c: Assertion 'IS_LEAF(mp)' failed``), which
no Python code can catch. The meta-page check in ``store`` cannot see such a
page. So a file this process did not write is walked first by a child that
opens it exactly as a reader does and touches every key and value of every
table: if the child dies or reports an error, the file is salvaged from a
page scan instead (pure Python, never LMDB's cursor), and the parent lives.

The child is this file run as a script: it imports only ``lmdb`` (about 40 ms).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A damaged tree can also make LMDB loop; a walk of a healthy journal of many
# GB takes seconds.
PROBE_TIMEOUT_S = 120.0


def probe(directory: Path) -> str | None:
    """None when the journal's tree reads cleanly; else what went wrong."""
    try:
        done = subprocess.run(
            [sys.executable, __file__, str(directory)],
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"reading its tree did not end within {PROBE_TIMEOUT_S:.0f} s"
    except OSError:  # no child can be started here: open it as before, unchecked
        return None
    if done.returncode == 0:
        return None
    tail = (done.stderr or b"").decode(errors="replace").strip().splitlines()
    detail = tail[-1][:300] if tail else ""
    if done.returncode < 0:
        return f"reading its tree killed the reader (signal {-done.returncode}) {detail}".strip()
    return detail or f"reading its tree failed (exit {done.returncode})"


def _walk(directory: str) -> None:
    import lmdb

    env = lmdb.open(directory, readonly=True, lock=True, max_dbs=16, subdir=True)
    try:
        with env.begin(buffers=True) as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
            for name in names:
                try:
                    db = env.open_db(name, txn=txn, create=False)
                except lmdb.Error:
                    continue  # a plain key in the main table, not a table
                for key, value in txn.cursor(db=db):
                    len(key), bytes(value[:1]), bytes(value[-1:])
    finally:
        env.close()


if __name__ == "__main__":
    _walk(sys.argv[1])
