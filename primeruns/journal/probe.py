"""Read a journal's whole LMDB tree in a child process before this one maps it.

LMDB has no page checksums and trusts its file: a page of the wrong type in
the middle of a tree (one zeroed page is enough) makes it fail an assertion
in C and abort the process (``mdb.c: Assertion 'IS_LEAF(mp)' failed``), which
no Python code can catch. The meta-page check in ``store`` cannot see such a
page. So a file this process did not write is walked first by a child that
opens it exactly as a reader does and touches every key and value of every
table: if the child dies or reports an error, the file is salvaged from a
page scan instead (pure Python, never LMDB's cursor), and the parent lives.

The child is this file run as a script: it imports only ``lmdb`` (~40 ms to
start), and walks many journals in one go (``probe_many``, for listings); a
journal that kills it is reported as damaged and the child is started again
for the rest. Results are kept for the process's life, one per journal (its
latest state: inode, size and times; at most ``KNOWN_MAX`` journals, the
least recently read dropped), so reopening an unchanged journal costs nothing;
across processes, listings keep what they read in summaries (``summary``),
and probe only a journal whose summary is missing or stale. A summary is
kept only of a file walked clean (or written by the process keeping it), at
its stamp: a file a current summary made in this boot names is vouched for
(``vouch``), and a reader of one journal (the dashboard's run page) maps it
with no child.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# A damaged tree can also make LMDB loop; a walk of a healthy journal of many
# GB takes seconds.
PROBE_TIMEOUT_S = 120.0
_DATA = "data.mdb"

_lock = threading.Lock()
# ``_run_child``'s verdict when no child could be started (fork failed): the
# journal is opened unchecked, and the verdict is no walk's, never kept.
_NO_CHILD = "no child could be started to walk it"
# A journal's file as ``stat`` sees it (see ``_key``).
FileKey = tuple[str, int, int, int, int]
# The verdicts, by real path: each journal's latest state only (a state the
# file has left never comes back: its change time cannot be set back), the
# least recently used dropped past ``KNOWN_MAX`` journals. Keyed by state,
# a dashboard watching a live journal kept one more per change for its life.
_known: OrderedDict[str, tuple[FileKey, str | None]] = OrderedDict()
KNOWN_MAX = 4096  # ~1 MB: a listing of more journals walks the rest again
# The journals (their real paths) opened unwalked for want of a child, until
# a walk of them: what was read of one vouches for nothing (``unwalked``).
_unwalked: set[str] = set()


def _key(directory: Path) -> FileKey | None:
    """What a verdict is kept under: the file as ``stat`` sees it. Its change
    time too: a file rewritten in place and given its old times back (``touch
    -r``, a copy that keeps them) is another file."""
    try:
        stat = os.stat(directory / _DATA)
    except OSError:
        return None
    real = os.path.realpath(directory)
    return (real, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def probe(directory: Path) -> str | None:
    """None when the journal's tree reads cleanly; else what went wrong.

    A walk made now that finds the tree clean is named in the journal's
    current summary (``summary.mark_walked``), so the next process to open it
    in this boot is spared the walk (``vouch``)."""
    directory = Path(directory)
    key = _key(directory)
    try:
        st = os.stat(directory / _DATA)
    except OSError:
        st = None
    with _lock:
        known = key is None or _recall(key) is not None
    verdict = probe_many([directory]).get(directory)
    if verdict is None and not known and st is not None and _walked(directory, key):
        # Imported here: this file is also the child's script (lmdb alone).
        from primeruns.journal.summary import mark_walked

        mark_walked(directory, [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return verdict


def _walked(directory: Path, key: FileKey | None) -> bool:
    """Whether ``directory``'s file was walked clean at ``key`` (not opened
    unwalked for want of a child, nor left unwalked as untrusted)."""
    with _lock:
        return key is not None and _recall(key) == (None,)


def probe_many(directories: Iterable[Path]) -> dict[Path, str | None]:
    """``probe`` for each directory, with one child process for all of them
    (one more after each journal that kills it)."""
    result: dict[Path, str | None] = {}
    todo: list[tuple[Path, FileKey]] = []
    with _lock:
        for directory in map(Path, directories):
            key = _key(directory)
            if key is not None and not _trusted(directory):
                result[directory] = None  # never opened: Journal.open says why
            elif key is None:
                result[directory] = None  # nothing to map: the open reports it
            elif (known := _recall(key)) is not None:
                result[directory] = known[0]
            else:
                todo.append((directory, key))
    while todo:
        found, rest = _run_child([d for d, _ in todo])
        with _lock:
            for (directory, key), verdict in zip(todo, found, strict=False):
                result[directory] = None if verdict is _NO_CHILD else verdict
                if verdict is _NO_CHILD:
                    _unwalked.add(key[0])
                else:
                    # Not one unwalked for want of a child: walked next time.
                    _remember(key, verdict)
                    _unwalked.discard(key[0])
        todo = todo[len(found) :] if rest else []
    return result


def unwalked(directory: Path) -> bool:
    """Whether this process opened the journal at ``directory`` without a
    walk, no child having started, and has not walked it since: what was read
    of it vouches for nothing (``vouch``): a tree damaged where that read did
    not go would be mapped unwalked by the next reader (the dashboard's
    process aborted)."""
    real = os.path.realpath(directory)
    with _lock:
        return real in _unwalked


def vouch(directory: Path, head: list[int]) -> None:
    """Take the tree of the journal at ``directory`` as walked clean while its
    data file is, by ``stat``, the one ``head`` names (device, inode, size,
    modification and change times: a current summary's stamp). The caller
    passes only a summary walked in this boot (``listing.journal_infos``): it
    is kept only of a file walked clean or written by the keeping process, a
    change since moves the change time, which cannot be set back, and a crash
    since (which may keep a file's times but not every data page) is another
    boot: the next open of another file is probed as ever."""
    try:
        st = os.stat(os.path.join(directory, _DATA))
    except OSError:
        return
    if [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] != head[:5]:
        return
    key = (os.path.realpath(directory), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _lock:
        if _recall(key) is None:  # (a walk's verdict, had one been made, stands)
            _remember(key, None)


def _recall(key: FileKey) -> tuple[str | None] | None:
    """The verdict kept for the file in state ``key`` (in a tuple: a clean
    walk's is None), or None if there is none; under ``_lock``."""
    kept = _known.get(key[0])
    if kept is None or kept[0] != key:
        return None
    _known.move_to_end(key[0])
    return (kept[1],)


def _remember(key: FileKey, verdict: str | None) -> None:
    """Keep ``verdict`` for the file in state ``key``, in place of its
    earlier state's; under ``_lock``."""
    _known[key[0]] = (key, verdict)
    _known.move_to_end(key[0])
    while len(_known) > KNOWN_MAX:
        _known.popitem(last=False)


def _trusted(directory: Path) -> bool:
    """Whether the child may open ``directory``'s files: LMDB writes its lock
    file even to read, so a planted link must not reach it (trust)."""
    # Imported here: this file is also the child's script, which must start
    # with lmdb alone (importing the package would cost it ~0.5 s).
    from primeruns.exceptions import JournalError
    from primeruns.journal.trust import check_dir, check_file

    try:
        check_dir(directory, "journal directory")
        for name in ("data.mdb", "lock.mdb"):
            check_file(directory / name)
    except JournalError:
        return False
    return True


def _run_child(directories: list[Path]) -> tuple[list[str | None], bool]:
    """Walk ``directories`` in order in one child; returns the verdicts it got
    to and whether some were left (the child died on the last one)."""
    # Imported here: this file also runs as a script, where a relative
    # import fails, and the child needs only lmdb; and a listing whose
    # summaries are current starts no child (subprocess: ~5 ms of its start-up).
    import subprocess

    from ..redaction import without_secrets

    try:
        done = subprocess.run(
            # -P: a script's own folder leads sys.path, and this folder holds
            # types.py, which would shadow the standard library's `types` in a
            # plain virtual environment (where no site hook imported it first):
            # every journal then read as damaged.
            [sys.executable, "-P", __file__],
            # NUL-separated absolute paths: a name may hold a newline, and the
            # child's working directory must not matter.
            input=b"\0".join(os.fsencode(os.path.abspath(d)) for d in directories),
            capture_output=True,
            timeout=PROBE_TIMEOUT_S * max(1, len(directories)),
            check=False,
            # It reads a file it does not trust and needs no credential:
            # whatever it is made to do, it has no key to give away.
            env=without_secrets(os.environ),
        )
    except subprocess.TimeoutExpired as exc:
        verdicts = _verdicts(exc.stdout or b"")
        verdicts.append(f"reading its tree did not end within {PROBE_TIMEOUT_S:.0f} s")
        return verdicts, len(verdicts) < len(directories)
    except OSError:  # no child can be started here: open as before, unchecked
        return [_NO_CHILD] * len(directories), False
    verdicts = _verdicts(done.stdout)
    if len(verdicts) < len(directories):  # it died on the next one
        tail = (done.stderr or b"").decode(errors="replace").strip().splitlines()
        detail = tail[-1][:300] if tail else ""
        if done.returncode < 0:
            why = f"reading its tree killed the reader (signal {-done.returncode}) {detail}"
        else:
            why = detail or f"reading its tree failed (exit {done.returncode})"
        verdicts.append(why.strip())
    return verdicts, len(verdicts) < len(directories)


def _verdicts(stdout: bytes) -> list[str | None]:
    out: list[str | None] = []
    for line in stdout.decode(errors="replace").splitlines():
        status, _, detail = line.partition(" ")
        out.append(None if status == "ok" else detail or "unreadable")
    return out


# The walk drops the map (see Store.drop_resident_pages) after reading this
# many bytes: every page read stays resident until then, and the child would
# otherwise hold the whole file, as large as the journal.
_REMAP_AFTER_BYTES = 32 << 20


def _walk(directory: str) -> None:
    import lmdb

    env = lmdb.open(directory, readonly=True, lock=True, max_dbs=16, subdir=True)
    try:
        with _retried(env.begin, env) as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
        for name in names:
            try:
                db = _retried(env.open_db, env, name, create=False)
            except lmdb.MapResizedError:
                raise  # not a plain key: a table that could not be read
            except lmdb.Error:
                continue  # a plain key in the main table, not a table
            start = _walk_some(env, db, None)
            while start is not None:
                env.set_mapsize(int(env.info()["map_size"]))
                start = _walk_some(env, db, start)
    finally:
        env.close()


def _walk_some(env: Any, db: Any, start: bytes | None) -> bytes | None:
    """Touch every key and value of ``db`` from the key after ``start`` in one
    transaction, up to ``_REMAP_AFTER_BYTES``; the last key read, or None at the end."""
    read = 0
    with _retried(env.begin, env, db=db, buffers=True) as txn:
        cursor = txn.cursor()
        more = cursor.first() if start is None else cursor.set_range(start)
        if more and start is not None and bytes(cursor.key()) == start:
            more = cursor.next()
        while more:
            key, value = cursor.item()
            len(key), bytes(value[:1]), bytes(value[-1:])
            read += len(key) + len(value)
            if read >= _REMAP_AFTER_BYTES:
                return bytes(key)
            more = cursor.next()
    return None


def _retried(call: Any, env: Any, *args: Any, **kwargs: Any) -> Any:
    """``call`` (a transaction begun, a table opened in one of its own),
    adopting a map the journal's writer grew past this one's
    (MapResizedError), as ``Store.begin`` does. The walk is many
    transactions over seconds of a journal its run may be writing: that
    failure would have called a healthy journal damaged, or, opening a
    table, passed the table over as a plain key, unread."""
    import lmdb

    try:
        return call(*args, **kwargs)
    except lmdb.MapResizedError:
        env.set_mapsize(0)
        return call(*args, **kwargs)


def _main() -> None:
    import lmdb

    # Often started beside a training loop (a run's start-up scan): yield to it.
    with contextlib.suppress(OSError):
        os.nice(10)

    for raw in sys.stdin.buffer.read().split(b"\0"):
        directory = os.fsdecode(raw)
        try:
            _walk(directory)
        except lmdb.Error as exc:
            print(f"bad {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
        else:
            print("ok", flush=True)


if __name__ == "__main__":
    _main()
