"""Which journals ship where they are, and which through a sync journal: what a listing asks.

``backlog`` ships a journal through its sync journal (``mirror``) when it is
a copy, or when a sync journal ships its run already; ``ls``, ``gc`` and the
dashboard say so of every journal they list. That question needs a journal's
meta, its lock file and the sync root's names only, so it lives here, apart
from the shipping (the uplink, the platform's client and httpx), which a
listing never loads.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from ..journal.lock import read_owner
from ..journal.meta import K_LOCAL_ID
from ..journal.origin import K_ORIGIN, Origin
from ..journal.store import DATA_NAME
from ..settings import default_sync_root

__all__ = [
    "K_SOURCE_PATH",
    "is_copy",
    "origin_of",
    "sync_name",
    "sync_names",
    "sync_path",
    "sync_root",
]

K_SOURCE_PATH = "sync.source"  # a sync journal's meta: the copy last imported from


def sync_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where sync journals live (:func:`primeruns.settings.default_sync_root`)."""
    return default_sync_root(environ)


def origin_of(path: Path, meta: Mapping[str, Any]) -> Origin | None:
    """Where the journal at ``path`` was written: its origin, or for a
    journal written before origins were recorded, the last owner its lock
    file names (taken as having written it here)."""
    origin = Origin.from_json(meta.get(K_ORIGIN))
    if origin is not None:
        return origin
    owner = read_owner(path)
    if owner is None:
        return None
    return Origin(
        host=owner.host,
        pid=owner.pid,
        proc_start=owner.proc_start,
        boot=None,
        path=str(path.absolute()),
        created=owner.started,
    )


def sync_name(path: Path, meta: Mapping[str, Any]) -> str:
    """The name of the journal's sync journal: its local id, else its folder's."""
    local_id = meta.get(K_LOCAL_ID)
    return local_id if isinstance(local_id, str) and local_id else path.name


def sync_path(path: Path, meta: Mapping[str, Any], root: Path) -> Path:
    """Where the journal's sync journal is (or would be) under ``root``."""
    return root / sync_name(path, meta)


def _plain(name: str) -> bool:
    """Whether ``name`` is one entry of a folder (no separator, not . or ..)."""
    return "/" not in name and name not in ("", ".", "..")


def is_copy(
    path: Path,
    meta: Mapping[str, Any],
    root: Path | None = None,
    *,
    in_root: Collection[str] | None = None,
) -> bool:
    """Whether the journal at ``path`` (its ``meta``) ships through its sync
    journal: a copy, or one whose run a sync journal ships already (so that
    the two never both ship it). ``in_root``: the names in ``root``, listed
    once by a caller asking of many journals (``sync_names``), so that a
    journal with no sync journal costs no ``stat``."""
    name = sync_name(path, meta)
    # A plain name not in the root has no sync journal; any other (a path a
    # journal's meta holds) is looked up.
    if in_root is None or name in in_root or not _plain(name):
        mine = (root if root is not None else sync_root()) / name
        if path.absolute() == mine.absolute():
            return False  # the sync journal itself (a replay of it)
        if (mine / DATA_NAME).exists():
            return True
    # A journal that does not say where it was written (damaged beyond its
    # meta) is shipped where it is, repaired, as before origins existed.
    origin = origin_of(path, meta)
    return origin is not None and not origin.is_original(path)


def sync_names(root: Path) -> frozenset[str]:
    """The names in the sync root (none when it is absent), for ``is_copy``'s ``in_root``."""
    try:
        return frozenset(os.listdir(root))
    except OSError:
        return frozenset()
