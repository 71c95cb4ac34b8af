"""A run's journals across the processes that fork: a child finds its parent's
platform run, a parent (or the command that ships it) finds its children.

A forked child journals into a journal of its own that names its parent's
(``K_FORK_PARENT``: the parent's local id; ``K_FORK_PARENT_PATH``: where the
parent's journal was). A child forked after the parent's run was registered
carries the platform run's id in its spec (``attach_id``). One forked before
that, or from an offline run, cannot: its run is found when it ships
(:func:`parent_binding`), from the parent's journal where the live run's
uplink records the registration, or from the parent's sync journal where
``primeruns sync``/``replay`` record it. Until the parent is registered the
child's journal keeps its records: the child's uplink retries while the
parent lives (:class:`ParentNotRegistered` is transient), and a command that
ships the parent ships its children with it (:func:`children_of`): before
the parent's close-out those that find the run (:func:`finds_its_run`), so
that the run closes after every record of it landed, and after it the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..exceptions import JournalError, PrimeRunsError, RetryableAPIError
from ..journal import Journal, journal_info
from ..journal.listing import made_since
from ..journal.lock import owner_alive, read_owner
from ..journal.meta import K_FORK_PARENT, K_FORK_PARENT_PATH
from ..journal.store import DATA_NAME
from ..spec import listed_spec
from . import sync_records
from .copies import check_sync_root, valid_local_id
from .mirror import sync_root

__all__ = [
    "K_FORK_PARENT",
    "K_FORK_PARENT_PATH",
    "ParentNotRegistered",
    "ParentNotShipped",
    "children_of",
    "finds_its_run",
    "made_since",
    "parent_binding",
]


class ParentNotRegistered(RetryableAPIError):
    """The child's parent lives but its run is not registered yet: retried
    (its uplink registers it when the platform answers)."""


class ParentNotShipped(PrimeRunsError):
    """The child's parent is gone and its run was never registered: ship the
    parent first (shipping it ships its children after it)."""


def parent_binding(parent: object, parent_path: object) -> dict[str, Any]:
    """The platform run of a forked child's parent (its local id and path, as
    the child's journal names them), as the parent's journal or its sync
    journal recorded it.
    Raises :class:`ParentNotRegistered` while the parent lives unregistered,
    :class:`ParentNotShipped` once it is gone so."""
    parent_id = valid_local_id(parent)  # untrusted: a copy's meta
    original = Path(parent_path) if isinstance(parent_path, str) and parent_path else None
    root = sync_root()
    for where in (original, root / parent_id):
        if where is None:
            continue
        if where != original:
            # A registration read from another user's sync root (or through a
            # link) would ship the child's records into their run.
            check_sync_root(root)
        if not (where / DATA_NAME).is_file():
            continue
        # In the forked child itself the parent's journal cannot be opened
        # (it is open in this process: see journal.store); its uplink can.
        with contextlib.suppress(JournalError, OSError):
            with Journal.open(where, owner=False) as parent:
                bound = parent.get_meta("platform")
            if isinstance(bound, dict) and bound.get("run_id"):
                return bound
    record = sync_records.recorded(root, parent_id) or {}
    if record.get("run_id"):
        return {"run_id": str(record["run_id"])}
    if original is not None and owner_alive(read_owner(original), original):
        raise ParentNotRegistered(
            f"the run of this forked child's parent ({parent_id}) is not registered yet"
        )
    raise ParentNotShipped(
        f"this journal is a forked child of run {parent_id}, which was never registered "
        f"on the platform: ship that run first (primeruns sync or replay {parent_id} "
        "ships its forked children after it)"
    )


def children_of(parent: Path, local_id: str) -> list[Path]:
    """The forked children's journals of the journal at ``parent`` (its local
    id ``local_id``) in the same runs dir, oldest first."""
    children = []
    with contextlib.suppress(OSError):
        for path in made_since(parent.parent, parent):
            with contextlib.suppress(JournalError, OSError):
                with Journal.open(path, owner=False) as journal:
                    if journal.get_meta(K_FORK_PARENT) == local_id:
                        children.append(path)
    return sorted(children, key=lambda p: p.name)


def finds_its_run(child: Path, meta: Mapping[str, Any] | None = None) -> bool:
    """Whether the forked child's journal at ``child`` can ship now, on its
    own: its spec names the platform run (it was forked after the run was
    registered), or its parent's registration is on record. ``replay`` and
    ``sync`` of a run ship such children before the run's own journal, whose
    close-out closes the run: the run is closed after every record of it
    landed, as its live ``finish()`` closes it after its children's.
    ``meta``: the child's, read already (a copy is read from a snapshot)."""
    try:
        meta = journal_info(child).meta if meta is None else meta
        spec = listed_spec(meta)
        if spec is not None and spec.attach_id:
            return True
        parent_binding(meta.get(K_FORK_PARENT), meta.get(K_FORK_PARENT_PATH))
    except (ParentNotRegistered, PrimeRunsError, OSError):
        return False
    return True
