"""Which journals of a runs directory make one run: for ``ls`` and ``show``.

A run is often several journals: a forked child's or a joined worker's
(its meta names its parent, ``ship.family.K_FORK_PARENT``), the other ranks
attached to the run by id (their specs name the platform run, or their
shipping bound it), a requeued job continuing it (the same run key). Listed one by one, a run
of eight workers reads as nine unrelated runs. This groups them from what a
listing has read already (each journal's meta, kept in its summary), so
grouping costs nothing per journal beyond a few dictionary look-ups: ``ls``
stays as cheap with thousands of runs.

Each group has a *head*, shown first with the others under it: the journal
no other is a child of that is the run's primary (ranks: ``ranks.K_ROLE``),
else the oldest. Every journal keeps a row of its own: each is shipped,
replayed, shown and collected by its own id, and each has its own shipping
state.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..journal.listing import JournalInfo, journal_infos, list_journals, made_since
from ..journal.meta import K_FORK_PARENT
from ..ranks import K_ROLE, Role
from ..reports import RunStatus, describe
from ..ship.copies import sync_root

__all__ = ["RunGroup", "group_of", "group_runs", "role_of", "run_id_of"]


@dataclass(frozen=True)
class RunGroup:
    """The journals of one run: its head, then the others, oldest first."""

    head: RunStatus
    others: list[RunStatus]

    @property
    def journals(self) -> list[RunStatus]:
        return [self.head, *self.others]

    def totals(self) -> dict[str, Any]:
        """What the whole run logged and lost, summed over its journals."""
        counts: Counter[str] = Counter()
        for status in self.journals:
            counts.update(status.counts)
        return {
            "journals": len(self.journals),
            "counts": {name: counts[name] for name in self.head.counts},
            "lost": sum(s.losses_total for s in self.journals),
            "pending": sum(_most_pending(s) for s in self.journals),
        }


def _most_pending(status: RunStatus) -> int:
    # Sinks ship the same records: the most any sink has left, as ``ls`` says it.
    return max((v for v in status.pending.values() if isinstance(v, int)), default=0)


def run_id_of(status: RunStatus) -> str | None:
    """The platform run a journal logs to: its spec's, else the one its
    shipping bound (None: neither, an offline run not synced yet)."""
    spec = status.spec
    run_id = (spec.attach_id if spec is not None else None) or status.platform.get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def _platform_run(status: RunStatus) -> str | None:
    """``run_id_of``, with the platform's root (two platforms may use one id)."""
    run_id = run_id_of(status)
    if run_id is None:
        return None
    spec = status.spec
    return f"{(spec.base_url if spec is not None else None) or ''} {run_id}"


def role_of(status: RunStatus) -> str | None:
    """This journal's part in its run, in words: "worker" (a forked child's
    or a joined worker's journal), "primary", its rank's label ("rank3"), or
    "attached" (a process attached by id, not the primary, with no rank);
    None for a journal that records no part (written before ranks)."""
    meta = status.info.meta
    if meta.get(K_FORK_PARENT):
        return "worker"
    role = Role.from_json(meta.get(K_ROLE))
    if role is None:
        return None
    if role.primary:
        return "primary"
    return role.label if role.rank is not None else "attached"


def _head_order(status: RunStatus) -> tuple[int, int, str]:
    meta = status.info.meta
    role = Role.from_json(meta.get(K_ROLE))
    return (
        1 if meta.get(K_FORK_PARENT) else 0,
        0 if role is None or role.primary else 1,
        status.info.path.name,
    )


def group_runs(found: list[RunStatus]) -> list[RunGroup]:
    """``found`` (a listing, oldest first) grouped by run, in the order of
    each group's oldest journal."""
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent.get(i, i) != i:
            i = parent[i]
        return i

    def join(a: int, b: int) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    by_id: dict[str, int] = {}
    by_run: dict[str, int] = {}
    for i, status in enumerate(found):
        by_id.setdefault(status.info.local_id, i)
        key = _platform_run(status)
        if key is not None:
            join(i, by_run.setdefault(key, i))
        # A requeued job's journals, offline and not synced yet: by their run key.
        run_key = status.spec.run_key if status.spec is not None else None
        if run_key:
            join(i, by_run.setdefault(f"run_key {run_key}", i))
    for i, status in enumerate(found):
        up = status.info.meta.get(K_FORK_PARENT)
        if isinstance(up, str) and up in by_id:
            join(i, by_id[up])
    members: dict[int, list[RunStatus]] = {}
    for i, status in enumerate(found):
        members.setdefault(root(i), []).append(status)
    groups = []
    for first in sorted(members):
        journals = members[first]
        head = min(journals, key=_head_order)
        groups.append(RunGroup(head, [s for s in journals if s is not head]))
    return groups


def group_of(status: RunStatus) -> RunGroup:
    """The run ``status``'s journal belongs to, among the journals beside it
    (``show``). What is read is bounded by the run, not the runs directory's
    history, where it can be: a run ``init()`` created has its children and
    the processes attached to it made after it (``made_since``: by name);
    only a journal attached by id to a run made elsewhere (a launcher's) may
    have older siblings, and has the whole directory listed. Either way, the
    journals beside it are read for which run each is (their meta, kept in
    their summaries), and only the run's own are counted: a long run made
    later, whose counts no summary holds yet, is not scanned to show another."""
    path = status.info.path
    spec = status.spec
    up = status.info.meta.get(K_FORK_PARENT)
    start = path.parent / up if isinstance(up, str) and up else path
    found = [status]
    with contextlib.suppress(OSError):
        if spec is not None and spec.attach_id:
            beside = list_journals(path.parent)
        else:
            made = [start, *made_since(path.parent, start)]
            beside = journal_infos([p for p in made if p != path and p.is_dir()])
        found = _run_beside(status, [info for info in beside if info.path != path])
    return _group_holding(found, status)


def _run_beside(status: RunStatus, beside: list[JournalInfo]) -> list[RunStatus]:
    """``status`` and the journals ``beside`` it (read uncounted) of its run, counted."""
    root = sync_root()
    listed = [describe(info, root) for info in beside]
    own = _group_holding(sorted([status, *listed], key=_by_name), status)
    others = [s.info.path for s in own.journals if s is not status]
    counted = [describe(info, root) for info in journal_infos(others, tally=True)]
    return sorted([status, *counted], key=_by_name)


def _by_name(status: RunStatus) -> str:
    return status.info.path.name


def _group_holding(found: list[RunStatus], status: RunStatus) -> RunGroup:
    """The group of ``found`` that holds ``status``'s journal, with ``status``
    itself in it (a listing of it may be older)."""
    path = status.info.path
    for group in group_runs(found):
        for member in group.journals:
            if member.info.path == path:
                if member is not status:
                    return RunGroup(
                        status if group.head is member else group.head,
                        [status if s is member else s for s in group.others],
                    )
                return group
    return RunGroup(status, [])
