"""Which journal of a run closes it, when a command ships several of its journals.

A run can be written by several journals: ranks attached to it by id (each
node's, copied to a login node), or the attempts of a job requeued offline
under one run key. ``replay`` and ``sync`` ship each journal through its
own close-out, and the one that closes the run must come after the others,
whose records would land in a closed run; the others must not close it.

- Ranks: the primary's close-out closes the run (``primeruns.ranks``), so
  the primary ships after the other ranks listed with it. Ranks are told
  by the platform run they write: the one they attached to by id, or the
  one their journal registered (rank 0 that created the run and handed its
  id to the others, ``init()`` without ``id=``).
- A run key: the journal holding the run's finish entry (the attempt that
  finished) closes it, so it ships after the key's other journals; and an
  attempt without one (killed, then requeued) leaves the run open even when
  the user says the job has ended (``--job-ended``): closed as crashed first,
  the run would end failed although its job completed (a status the
  finishing journal's close cannot change any more).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..ranks import K_ROLE, Role
from ..ship.family import K_FORK_PARENT
from ..spec import RunSpec, listed_spec

__all__ = ["Listed", "closers", "finished_by"]


@dataclass(frozen=True)
class Listed:
    """A journal a command may ship: its path, its meta, and whether it
    holds a finish entry (for a copy listed unopened, as its private
    snapshot reads; False when that cannot be read)."""

    path: Path
    meta: Mapping[str, Any]
    finished: bool = False


def closers(listed: Iterable[Listed]) -> set[Path]:
    """The journals that close a run other listed journals write too: each
    shipped after those (module doc)."""
    attached: dict[str, list[Listed]] = {}
    keyed: dict[str, list[Listed]] = {}
    for journal in listed:
        spec = listed_spec(journal.meta)
        run = _platform_run(journal.meta, spec)
        if run is not None:
            attached.setdefault(run, []).append(journal)
        if spec is not None and spec.run_key:
            keyed.setdefault(spec.run_key, []).append(journal)
    out = set()
    for journals in attached.values():
        if len(journals) < 2:
            continue
        for journal in journals:
            role = Role.from_json(journal.meta.get(K_ROLE))
            if role is not None and role.primary and not journal.meta.get(K_FORK_PARENT):
                out.add(journal.path)
    for journals in keyed.values():
        if len(journals) >= 2:
            out.update(journal.path for journal in journals if journal.finished)
    return out


def _platform_run(meta: Mapping[str, Any], spec: RunSpec | None) -> str | None:
    """The platform run a journal writes: attached to by id, else registered."""
    if spec is not None and spec.attach_id:
        return spec.attach_id
    bound = meta.get("platform")
    run_id = bound.get("run_id") if isinstance(bound, Mapping) else None
    return run_id if isinstance(run_id, str) and run_id else None


def finished_by(listed: Iterable[Listed]) -> dict[Path, str]:
    """Per journal of a run key without a finish entry, the name of a listed
    journal of that key that holds one (and closes the run)."""
    keyed: dict[str, list[Listed]] = {}
    for journal in listed:
        spec = listed_spec(journal.meta)
        if spec is not None and spec.run_key:
            keyed.setdefault(spec.run_key, []).append(journal)
    out: dict[Path, str] = {}
    for journals in keyed.values():
        done = [journal.path.name for journal in journals if journal.finished]
        if done:
            out.update((j.path, done[-1]) for j in journals if not j.finished)
    return out
