"""What a listing read of a journal, kept so that the next listing reads only what changed.

Listing a journal (``ls``, ``gc``, ``replay --all``, the dashboard, the
crashed-run hint of every online ``init()``) walks its tree in a child first
(``probe``), opens it, and for the commands that show counts reads every
entry's header: milliseconds to seconds a journal, paid again by every
process for every past run (3,000 past runs: ~20 s for ``ls``, and a loop
slowed by the hint's scan). What a listing reads depends on the journal's
files alone, so it is kept, one small JSON file per journal, in a private
folder beside the journals (``<runs dir>/.summaries/<name>.json``), with the
*stamp* of the files it was read from, and used again while the stamp holds.

The stamp is cheap to take (three ``stat`` calls and 8 KiB read) and moves
with anything a reader could see:

- ``data.mdb``: its device, inode, size, modification and change times, and
  the newest transaction id its meta pages name (LMDB raises it at every
  commit, so a write within the file system's timestamp granularity is seen
  too; the change time cannot be set back, as ``touch`` sets the other);
- each spool segment: its name, inode, size and change time (a segment only
  grows, and is deleted only once LMDB holds it, which commits).

A listing reads the journal after taking its stamp, so a summary may
describe a newer state than its stamp, never an older one; and a newer state
has another stamp, so it is read again next time.

Summaries are never trusted beyond that. A journal copied in from another
place has new inodes, so nothing kept of another journal is ever taken for
it; summaries live outside the journals' folders, so a copy brings none and
copies are never written (``ship.mirror``). The folder is this user's and
private (``trust``); a summary is read without following links, bounded in
size, and anything unexpected in it (not JSON, another version, another
stamp) makes it missing: the journal is then probed and read as before, and
its summary written anew. Nothing in a summary says whether the owner lives:
that is read from the lock file, or, for an owner found dead for good, from
the runs directory's index while the lock file is unchanged
(``summary_index``).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from primeruns.exceptions import JournalError
from primeruns.journal.origin import boot_id
from primeruns.journal.spool import list_segments
from primeruns.journal.store import DATA_NAME, last_txnid
from primeruns.journal.trust import check_dir

__all__ = [
    "FOLDER",
    "MAX_BYTES",
    "RACY_NS",
    "WALKED_IN",
    "Files",
    "Seen",
    "Shelf",
    "files",
    "mark_walked",
    "seen_now",
    "taken_now",
]

#: The folder, beside the journals, that holds their summaries.
FOLDER = ".summaries"
#: The largest summary kept: a journal whose listing is larger (a meta value
#: of megabytes) is read every time rather than copied into a file as large.
MAX_BYTES = 1 << 20
_VERSION = 1
_TEMP_PREFIX = ".tmp-"
_STALE_TEMP_S = 3600.0  # a writer that died between writing and renaming

Stamp = list[Any]

#: A summary's field naming the boot (``origin.boot_id``) in which its file
#: was walked clean or written by the process keeping it; None (or absent)
#: when it was read unwalked (``probe.unwalked``), or kept by a version that
#: did not write it until a walk of it since (``mark_walked``). Only a summary
#: walked in this boot vouches for its file (``probe.vouch``): a crash since,
#: here or on the machine a disk came from, may have kept the file's times
#: and meta page but not every data page the walk read.
WALKED_IN = "walked_in_boot"


#: How long before a stamp was taken a file must have last changed for its
#: ``stat`` alone to prove it unchanged since (``files``' ``known``): far
#: above any file system's timestamp granularity, and a clock's small steps back.
RACY_NS = 2_000_000_000


@dataclass(frozen=True)
class Files:
    """A journal's files as ``stat`` sees them."""

    stamp: Stamp | None
    """What moves with any change (module doc); None when the journal cannot
    be stamped (no ``data.mdb``, no valid meta page): it is read every time."""
    size_bytes: int
    modified: float
    taken: int = 0
    """``time.time_ns()`` before the stamp was taken."""
    folder: tuple[int, int] | None = None
    """The journal folder's modification and change times (ns) then."""

    def settled(self, ctime_ns: int) -> bool:
        """Whether a file whose change time was ``ctime_ns`` when this stamp was
        taken had last changed long enough before that a write since would
        show in its change time (the kernel sets it to the time of the write)."""
        return ctime_ns < self.taken - RACY_NS

    def txnid_while(self, head: list[int]) -> int | None:
        """The transaction id of this stamp, if ``data.mdb``'s ``stat`` now
        (``head``: device, inode, size, modification and change times) proves
        it still is: the same as then, and settled then."""
        if self.stamp is None or self.stamp[:5] != head or not self.settled(head[4]):
            return None
        txnid: int = self.stamp[5]
        return txnid


def _fields_in(raw: bytes | str, stamp: Stamp) -> dict[str, Any] | None:
    """The fields of a summary's text, if it is a summary taken at ``stamp``."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("v") != _VERSION or doc.get("stamp") != stamp:
        return None
    fields = doc.get("fields")
    return fields if isinstance(fields, dict) else None


#: What a stamp is taken from: ``time.time_ns()``, then the ``lstat`` of the
#: journal's folder and of its ``data.mdb`` (None where it failed).
Seen = tuple[int, os.stat_result | None, os.stat_result | None]


def taken_now() -> int:
    """The time a stamp is taken at (``Files.taken``): before its ``lstat`` calls."""
    return time.time_ns()


def seen_now(folder: str) -> Seen:
    """The ``Seen`` of the journal folder ``folder``, taken now."""
    taken = taken_now()
    here: os.stat_result | None = None
    data: os.stat_result | None = None
    with contextlib.suppress(OSError):
        here = os.lstat(folder)
    with contextlib.suppress(OSError):
        data = os.lstat(os.path.join(folder, DATA_NAME))
    return taken, here, data


def files(path: Path, known: Files | None = None, seen: Seen | None = None) -> Files:
    """The stamp, total bytes and newest write time of the journal at ``path``
    (its ``data.mdb`` and spool segments, where the newest entries may be).

    ``known``: what an earlier call found (a caller that lists again and
    again keeps it: ``memo``; a listing of the whole runs directory has it
    from the directory's index: ``summary_index``), returned itself when
    every read it spares proves it still is. Two of the stamp's reads are
    spared where it proves them unchanged: ``data.mdb``'s transaction id
    (8 KiB read), where its ``stat`` is as then and it had settled then
    (``Files.settled``: a commit since would have moved its change time); and
    the folder's listing for spool segments, where it had none then and its
    times, settled then, are as they were (a segment made or removed moves
    them).

    ``seen``: the ``lstat`` calls the stamp starts from, taken by the caller
    (``listing.journal_dirs`` made them to find the journal: not made twice)."""
    # Plain strings and os calls: a listing stamps thousands of journals.
    folder = os.fspath(path)
    taken, here, data = seen if seen is not None else seen_now(folder)
    stamp: Stamp | None
    times = None if here is None else (here.st_mtime_ns, here.st_ctime_ns)
    reused = False
    if data is None:
        stamp, size, modified = None, 0, 0.0
    else:
        size, modified = data.st_size, data.st_mtime
        head = [data.st_dev, data.st_ino, data.st_size, data.st_mtime_ns, data.st_ctime_ns]
        txnid = known.txnid_while(head) if known is not None else None
        reused = txnid is not None
        if txnid is None and stat.S_ISREG(data.st_mode):
            txnid = last_txnid(os.path.join(folder, DATA_NAME))
        stamp = None if txnid is None else [*head, txnid, []]
    if (
        known is not None
        and known.stamp is not None
        and not known.stamp[6]
        and times is not None
        and known.folder == times
        and known.settled(times[1])
    ):
        if reused and modified == known.modified:
            return known  # all as then: the same answer, not another object a journal
        return Files(stamp, size, modified, taken, times)  # no segment made since
    for _, name in list_segments(path):
        try:
            segment = os.lstat(os.path.join(folder, name))
        except OSError:
            continue  # absorbed into LMDB meanwhile, which moved its transaction id
        size += segment.st_size
        modified = max(modified, segment.st_mtime)
        if stamp is not None:
            stamp[-1].append([name, segment.st_ino, segment.st_size, segment.st_ctime_ns])
    return Files(stamp, size, modified, taken, times)


class Shelf:
    """The summaries of the journals in one folder (a runs directory).

    Every method is best effort: a summary that cannot be read is missing, one
    that cannot be written is not kept, and neither raises."""

    def __init__(self, runs_dir: Path, *, texts: bool = False) -> None:
        self.runs_dir = Path(runs_dir)
        self.folder = self.runs_dir / FOLDER
        self._folder = os.fspath(self.folder)
        self._usable: bool | None = None  # looked at once per shelf
        self._made = False
        self.texts: dict[str, str] | None = {} if texts else None
        """The summaries loaded or saved, by journal name, when asked for
        (``texts=True``): what a listing of the whole directory writes its
        index from (``summary_index``)."""
        self.fields_read: dict[str, tuple[Stamp, dict[str, Any]]] | None = {} if texts else None
        """The same summaries' stamps and fields, as a listing reads them
        back (``texts=True``): what the index's listing rows are made from."""

    def usable(self, *, create: bool = False) -> bool:
        """Whether the folder is this user's and private (made so if ``create``
        and the runs directory is too): summaries are read and written only there."""
        if self._usable is None or (create and not self._usable and not self._made):
            self._made = self._made or create
            self._usable = self._check(create)
        return self._usable

    def _check(self, create: bool) -> bool:
        try:
            check_dir(self.runs_dir, "runs directory")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.folder, 0o700)
            st = os.lstat(self.folder)
            check_dir(self.folder, "summaries folder")
        except (JournalError, OSError):
            return False
        return stat.S_ISDIR(st.st_mode)

    def load(self, name: str, stamp: Stamp | None) -> dict[str, Any] | None:
        """The summary of journal ``name`` if it was taken at ``stamp``; None
        when there is none, it is of another state, or anything is odd about it."""
        if stamp is None or not self.usable():
            return None
        try:
            fd = os.open(
                os.path.join(self._folder, f"{name}.json"),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
            )
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_BYTES:
                return None
            raw = os.pread(fd, st.st_size, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        fields = _fields_in(raw, stamp)
        if fields is not None and self.texts is not None:
            self.texts[name] = raw.decode()
            self._note(name, stamp, fields)
        return fields

    def _note(self, name: str, stamp: Stamp, fields: dict[str, Any] | None) -> None:
        if self.fields_read is not None:
            if fields is None:
                self.fields_read.pop(name, None)
            else:
                self.fields_read[name] = (stamp, fields)

    def load_text(self, name: str, stamp: Stamp | None, text: str | None) -> dict[str, Any] | None:
        """As ``load``, from the text of journal ``name``'s summary as an index
        holds it (``summary_index``)."""
        if stamp is None or text is None or len(text) > MAX_BYTES:
            return None
        fields = _fields_in(text, stamp)
        if fields is not None and self.texts is not None:
            self.texts[name] = text
            self._note(name, stamp, fields)
        return fields

    def save(self, name: str, stamp: Stamp | None, fields: dict[str, Any]) -> None:
        """Keep ``fields`` (JSON values) as what journal ``name`` held at ``stamp``."""
        if stamp is None or not self.usable(create=True):
            return
        try:
            # The standard library's encoder: it writes what the journal held
            # (integers of any size, NaN) or fails, where orjson would write
            # NaN as null; such a summary then fails to load, and the journal
            # is read instead.
            encoded = json.dumps(
                {"v": _VERSION, "stamp": stamp, "fields": fields}, separators=(",", ":")
            ).encode()
        except (TypeError, ValueError, RecursionError):
            return
        if len(encoded) > MAX_BYTES:
            return
        if self.texts is not None:
            self.texts[name] = encoded.decode()
            # As the next listing reads it back (orjson: a NaN, which it
            # refuses, leaves the summary, and its row, missing).
            self._note(name, stamp, _fields_in(encoded, stamp))
        with contextlib.suppress(OSError):
            # Written whole under a temporary name, then renamed: a reader sees
            # the old summary or the new one, never a part. tempfile (shutil and
            # random with it) is loaded here: a listing of summaries writes none.
            import tempfile

            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=self.folder)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(encoded)
                os.replace(temp, self.folder / f"{name}.json")
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise

    def forget(self, name: str) -> None:
        """Drop journal ``name``'s summary (the journal was deleted)."""
        if not self.usable():
            return
        with contextlib.suppress(OSError):
            os.unlink(self.folder / f"{name}.json")

    def prune(self, journals: set[str]) -> None:
        """Drop the summaries of journals no longer here (deleted by hand), and
        temporary files their writers left: the folder holds no more than the
        runs directory does."""
        if not self.usable():
            return
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(self.folder) as entries:
            for entry in entries:
                if entry.name.startswith(_TEMP_PREFIX):
                    with contextlib.suppress(OSError):
                        if now - entry.stat(follow_symlinks=False).st_mtime > _STALE_TEMP_S:
                            os.unlink(entry.path)
                elif entry.name.endswith(".json") and entry.name[:-5] not in journals:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


def mark_walked(path: Path, head: list[int]) -> None:
    """Name this boot in the summary of the journal at ``path``, which a
    child has just walked clean while its ``data.mdb`` was, by ``stat``,
    ``head`` (device, inode, size, modification and change times), if that
    summary is current and names no walk in this boot.

    A summary kept without the field (by an earlier version, or read
    unwalked) vouched for nothing, so every process that opened the journal
    walked it again, though nothing changed: now the first walk of a boot
    vouches for the next processes. Only a summary of the file as walked
    (its stamp's ``stat``, and change time, as then) is marked. Never raises."""
    try:
        boot = boot_id()
        shelf = Shelf(path.parent)
        if boot is None or not shelf.usable():
            return
        found = files(path)
        if found.stamp is None or found.stamp[:5] != head:
            return
        kept = shelf.load(path.name, found.stamp)
        if kept is None or kept.get(WALKED_IN) == boot:
            return
        shelf.save(path.name, found.stamp, {**kept, WALKED_IN: boot})
    except Exception:  # a summary is an optimisation, never a failure
        return
