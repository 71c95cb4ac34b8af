"""The summaries of a whole runs directory in one file, read once by a listing of it.

A summary is one small file a journal (``summary``): the unit a listing
writes, since it reads only the journals that changed, and what a reader of
a few journals uses (``gc``'s candidates, ``show``'s run, the crashed-run
hint). A listing of the whole directory (``ls``, ``gc``, ``sync --all``, the
dashboard) read every one of them, and took every journal's stamp afresh
(8 KiB of its ``data.mdb``, a listing of its folder): with 3,000 past runs,
9,000 file reads on every ``ls``, most of its time on a busy disk.

The index holds, per journal, its summary file's text and the ``Files`` its
stamp was taken as (with the time it was taken), in one file beside the
summaries (``<runs dir>/.summaries/.index``). A listing of the whole
directory reads it once; an entry's summary is used only where its stamp is
the journal's stamp now (exactly as a summary file's), and its ``Files``
spares the stamp's reads where ``stat`` proves them unchanged
(``summary.files``'s ``known``, as the dashboard's memo does within one
process). An entry that does not parse or check is missing, and the journal
is read from its own summary, or itself, as before.

Beside each entry the index keeps a *listing row*: the summary's fields with
only the meta values ``primeruns ls`` reads (``ROW_META``; the spec, the
platform binding, the origin and a few more: about a third of a summary, which
carries the journal's whole meta), at the same stamp. ``ls`` of 3,000 past
runs parsed 8.4 MB of summaries to show about twenty values of each; it
parses their rows, and a summary's text only where its row is missing or
stale. A row is what its summary says, cut down: it is made from the
summary as a listing reads it back, checked as a summary is, and used only
at its own stamp; one that is not as written is missing.

Beside them it keeps the owner each past journal's lock file names, where a
listing found it dead by its pids (``lock.dead_for_good``), with the file's
``lstat`` then and the boot: the uplink of an online run leaves its name in
the file, and reading and judging 3,000 of them was a fifth of ``ls``. Such
an owner is not read nor judged again while the file's ``lstat`` is as then
(a write moves its change time; one settled then: ``summary.RACY_NS``) in
the same boot; a live owner is never kept, so a running one is always read.

It is rewritten whole (a temporary file renamed over the old) by a listing
of the whole directory once more than a few of its entries are stale
(``stale_most``), not at every listing that found one journal changed: a
live run beside thousands of past ones would have it written by every
``ls``. Until then a changed journal costs its own summary file's read.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

import orjson

from primeruns.journal.meta import K_UNREADABLE
from primeruns.journal.origin import boot_id
from primeruns.journal.summary import RACY_NS, Files, Stamp
from primeruns.spec import SPEC_KEY, listed_spec

__all__ = [
    "INDEX_NAME",
    "MAX_INDEX_BYTES",
    "ROW_META",
    "DeadOwner",
    "Index",
    "dead_owner_of",
    "row_of",
    "stale_most",
]

#: The index's name in the summaries folder (not ``*.json``: no journal's summary).
INDEX_NAME = ".index"
#: The largest index read or written (about 3 KB a journal: 20,000 runs and more).
MAX_INDEX_BYTES = 64 << 20
_VERSION = 1
_TEMP_PREFIX = ".tmp-"  # the summaries' own: pruned with theirs when a writer died


#: The meta values a listing row keeps: those ``primeruns ls`` reads of a
#: journal (``reports.describe``, ``commands.ls``, ``run_groups``,
#: ``ship.copies``), named here because those modules import this package.
#: A listing that reads another lists without rows (``list_journals``).
ROW_META = frozenset(
    {
        SPEC_KEY,
        "platform",
        "finalized",
        "journal.local_id",
        "journal.origin",
        "journal.skipped",
        K_UNREADABLE,
        "fork_parent",
        "role",
        "sync.source",
        "sync.source_losses",
        "sync.copied_from",
        "sink_off.traces",
        "sink_off.eval_samples",
        "sink_off.train_samples",
        "sink_off.train_metrics",
    }
)
#: What a summary's fields become in a row, besides its meta.
_ROW_FIELDS = ("last_seq", "cursors", "losses", "finish", "after")


def row_of(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The listing row of a summary's ``fields``: its meta cut to
    ``ROW_META``, and what else a listing reads; None when its meta holds
    none of them (an empty meta reads as a damaged journal's) or the fields
    are not a summary's."""
    meta = fields.get("meta")
    if not isinstance(meta, dict) or any(name not in fields for name in _ROW_FIELDS):
        return None
    kept = {key: value for key, value in meta.items() if key in ROW_META}
    if meta and not kept:
        return None
    if SPEC_KEY in kept:
        kept[SPEC_KEY] = _listed_spec(kept[SPEC_KEY])
    row = {name: fields[name] for name in _ROW_FIELDS}
    # As ``summary_fields.info_from`` reads a summary: no large value sized
    # (a row serves no bounded reader), no full scan.
    row.update(meta=kept, meta_bytes={}, verified=None)
    return row


#: The fields of a journal's spec that ``primeruns ls`` reads (``RunStatus.spec``).
_SPEC_SHOWN = ("kind", "name", "mode", "attach_id", "base_url", "run_key")


def _listed_spec(spec: Any) -> Any:
    """A journal's stored spec as a row keeps it: a spec a listing reads
    (``spec.listed_spec``) cut to ``_SPEC_SHOWN`` (a fifth of it: its
    environments, config and URLs are not shown), else as it is, to be
    found damaged again."""
    if listed_spec({SPEC_KEY: spec}) is None:
        return spec
    return {key: spec[key] for key in _SPEC_SHOWN if key in spec}


#: A dead owner as the index keeps it: its lock file's device, inode, size,
#: modification and change times (ns), the boot, and the owner described.
DeadOwner = list[Any]


def _lock_head(found: os.stat_result) -> list[int]:
    return [found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns]


def dead_owner_of(found: os.stat_result, taken: int, described: str) -> DeadOwner | None:
    """The entry of an owner found dead for good (``lock.dead_for_good``),
    described so, in a lock file whose ``lstat`` was ``found`` at ``taken``
    (``time.time_ns()`` before it); None when the file changed too lately for
    its ``lstat`` to show a write since, or there is no boot to name."""
    boot = boot_id()
    if boot is None or found.st_ctime_ns >= taken - RACY_NS:
        return None
    return [*_lock_head(found), boot, described]


def stale_most(journals: int) -> int:
    """How many stale entries a listing of ``journals`` leaves in the index
    before writing it anew: each costs a summary file's read a listing, a
    rewrite costs about as much as reading the whole index once."""
    return 16 + journals // 32


class Index:
    """The index of the summaries folder ``folder``, read on first use.

    Best effort, as the summaries: an index that cannot be read is empty, one
    that cannot be written is not, and neither raises."""

    def __init__(self, folder: Path) -> None:
        self.path = os.path.join(folder, INDEX_NAME)
        self._folder = folder
        self._entries: dict[str, list[Any]] | None = None
        self._rows: dict[str, Any] = {}
        self._dead: dict[str, Any] = {}
        self._given: set[str] = set()  # the rows ``row`` gave this listing

    @property
    def read(self) -> bool:
        """Whether it was read (a listing that asked nothing of it need not write it)."""
        return self._entries is not None

    @property
    def entries(self) -> dict[str, list[Any]]:
        """Per journal name: ``[files, summary text]`` as written (unchecked)."""
        if self._entries is None:
            self._entries, self._rows, self._dead = _read(self.path)
        return self._entries

    def dead_owner(self, name: str, found: os.stat_result) -> DeadOwner | None:
        """The entry of the owner journal ``name``'s lock file named when a
        listing found it dead for good, if the file's ``lstat`` is ``found``
        as then, in this boot (then it names that owner, still dead)."""
        self.entries  # noqa: B018 (read on first use)
        kept = self._dead.get(name)
        if (
            type(kept) is not list
            or len(kept) != 7
            or type(kept[6]) is not str
            or kept[:5] != _lock_head(found)
            or kept[5] != boot_id()
        ):
            return None
        return kept

    def row(self, name: str, stamp: Stamp | None) -> dict[str, Any] | None:
        """Journal ``name``'s listing row, if it was made at ``stamp`` (its
        entry's: a row is written only with an entry of the stamp it was
        made at)."""
        found = self._row_at(name, stamp)
        if found is not None:
            self._given.add(name)
        return found

    def _row_at(self, name: str, stamp: Stamp | None) -> dict[str, Any] | None:
        entry = self.entries.get(name)
        if entry is None or stamp is None or _stamp_of(entry[0]) != stamp:
            return None
        row = self._rows.get(name)
        return row if type(row) is dict else None

    def files(self, name: str) -> Files | None:
        """The ``Files`` journal ``name``'s entry was stamped as, if it is well formed."""
        entry = self.entries.get(name)
        return _files_of(entry[0]) if entry is not None else None

    def summary_text(self, name: str) -> str | None:
        """The text of journal ``name``'s summary as the index holds it."""
        entry = self.entries.get(name)
        return entry[1] if entry is not None else None

    def refresh(
        self,
        listed: dict[str, Files],
        texts: dict[str, str],
        fields_read: dict[str, tuple[Stamp, dict[str, Any]]],
        dead: dict[str, DeadOwner],
    ) -> None:
        """After a listing of the whole directory: ``listed``, each journal
        that can be stamped and the ``Files`` it was found as; ``texts``, the
        summaries this listing read from files or wrote, by name, and
        ``fields_read``, their stamps and fields (``Shelf.fields_read``);
        ``dead``, the owners found dead for good (``dead_owner_of``) or so
        kept still. Written anew when more than ``stale_most`` entries, rows
        or dead owners are stale or missing."""
        entries = self.entries
        stale = sum(1 for name in entries if name not in listed)
        stale += sum(1 for name, owner in dead.items() if self._dead.get(name) != owner)
        made: dict[str, dict[str, Any]] = {}  # rows made anew from summaries read now
        # Counted first, built only to be written: a listing that writes
        # nothing (nearly every one) copies no entry nor row.
        for name, found in listed.items():
            entry = entries.get(name)
            current = entry is not None and _stamp_of(entry[0]) == found.stamp
            seen = fields_read.get(name)  # its summary, read or written now (so an entry too)
            # A row given and its summary read all the same did not serve (no
            # counts; not as written): made anew, as a missing one. (A listing
            # that reads no rows reads every summary: the rows stay.)
            if seen is not None and (name in self._given or not self._has_row(name, current)):
                row = row_of(seen[1]) if seen[0] == found.stamp else None
                if row is not None:
                    made[name] = row
                    stale += 1
            if not current:
                stale += 1
        if stale <= stale_most(len(listed)):
            return
        fresh: dict[str, list[Any]] = {}
        rows: dict[str, dict[str, Any]] = {}
        for name, found in listed.items():
            entry = entries.get(name)
            current = entry is not None and _stamp_of(entry[0]) == found.stamp
            if name in made:
                rows[name] = made[name]
            elif self._has_row(name, current):
                rows[name] = self._rows[name]
            text = texts.get(name)  # read or written now: as current, or more
            if entry is not None and current:
                fresh[name] = [_files_json(found), entry[1] if text is None else text]
            elif text is not None:
                fresh[name] = [_files_json(found), text]
        self._write(fresh, rows, dead)

    def _has_row(self, name: str, current: bool) -> bool:
        """Whether journal ``name`` has a row, given whether its entry is
        ``current`` (a row is written only with the entry of its stamp)."""
        return current and type(self._rows.get(name)) is dict

    def _write(
        self,
        entries: dict[str, list[Any]],
        rows: dict[str, dict[str, Any]],
        dead: dict[str, DeadOwner],
    ) -> None:
        doc = {
            "v": _VERSION,
            "entries": entries,
            "row_meta": _ROW_NAMES,
            "rows": rows,
            "dead_owners": dead,
        }
        try:
            encoded = orjson.dumps(doc)
        except (TypeError, ValueError):
            return
        if len(encoded) > MAX_INDEX_BYTES:
            return
        with contextlib.suppress(OSError):
            import tempfile  # here: a listing that changed nothing writes no index

            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=self._folder)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(encoded)
                os.replace(temp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        self._entries, self._rows, self._dead = entries, rows, dict(dead)


_ROW_NAMES = sorted(ROW_META)


def _read(path: str) -> tuple[dict[str, list[Any]], dict[str, Any], dict[str, Any]]:
    """The index's entries, each ``[files, text]``, its rows and its dead
    owners (unchecked: ``Index.row``, ``Index.dead_owner``); empty when
    anything is odd, and no rows when they keep other meta than ``ROW_META``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}, {}, {}
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_size > MAX_INDEX_BYTES
        ):
            return {}, {}, {}
        doc = orjson.loads(os.pread(fd, st.st_size, 0))
    except (OSError, orjson.JSONDecodeError):
        return {}, {}, {}
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("v") != _VERSION:
        return {}, {}, {}
    entries = doc.get("entries")
    if not isinstance(entries, dict):
        return {}, {}, {}
    rows = doc.get("rows")
    if not isinstance(rows, dict) or doc.get("row_meta") != _ROW_NAMES:
        rows = {}  # (an earlier version's index has none)
    dead = doc.get("dead_owners")
    if not isinstance(dead, dict):
        dead = {}  # (nor dead owners)
    return (
        {
            name: entry
            for name, entry in entries.items()
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str)
        },
        rows,
        dead,
    )


def _files_json(found: Files) -> list[Any]:
    return [found.stamp, found.size_bytes, found.modified, found.taken, found.folder]


def _stamp_of(value: Any) -> Stamp | None:
    return value[0] if isinstance(value, list) and value else None


def _files_of(value: Any) -> Files | None:
    """The ``Files`` an entry holds, only if every part is of its type: a
    stamp of five integers, a transaction id and segments, each segment a
    name and three integers. (Plain loops: a listing checks thousands.)"""
    if type(value) is not list or len(value) != 5:
        return None
    stamp, size, modified, taken, folder = value
    if type(stamp) is not list or len(stamp) != 7 or type(stamp[6]) is not list:
        return None
    for number in (*stamp[:6], size, taken):
        if type(number) is not int:
            return None
    if type(modified) is not float and type(modified) is not int:
        return None
    for segment in stamp[6]:
        if type(segment) is not list or len(segment) != 4 or type(segment[0]) is not str:
            return None
        for number in segment[1:]:
            if type(number) is not int:
                return None
    if folder is not None:
        if type(folder) is not list or len(folder) != 2:
            return None
        if type(folder[0]) is not int or type(folder[1]) is not int:
            return None
    return Files(stamp, size, float(modified), taken, None if folder is None else tuple(folder))
