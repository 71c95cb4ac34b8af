"""Several processes, one run (issue #29, "Done when"): the oracle over the
matrix {a child of ``os.fork()``, a multiprocessing pool with the fork,
forkserver or spawn start (the latter two join with ``run.handle()`` and
``pr.join``), four ranks attached by id} x {evaluation, training} x {no
fault, a worker SIGKILLed, the primary SIGKILLed then replayed}.

Every cell: every record whose call returned lands exactly once in every
sink; the run is closed once, by its primary, after every record landed,
with its status (a primary SIGKILLed and replayed: a run it created closes
as failed, one it attached to stays its launcher's to close); each step's
metrics row holds every process's key (``one_run_oracle``).

A pool one of whose workers is SIGKILLed is a ``ProcessPoolExecutor`` (a
``multiprocessing.Pool`` can hang for good then, see ``rel_family.py``),
every other pool a ``multiprocessing.Pool``.

The default suite runs a covering sample (each topology, each kind and each
fault at least once); ``-m slow`` runs the rest of the product.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import fork_oracle as fo
import one_run_family
import one_run_oracle as oracle
import pytest

from primeruns.local import LocalPlatform

TOPOLOGIES = ("fork", "pool-fork", "pool-forkserver", "pool-spawn", "ranks")
KINDS = ("eval", "train")
FAULTS = ("none", "worker", "primary")

_ALL = list(itertools.product(TOPOLOGIES, KINDS, FAULTS))
# Each value of each dimension at least once, the spawned pool (the
# slowest to start) once, and a pool whose worker is SIGKILLed (an
# executor: a multiprocessing.Pool hung there, [pool-fork-eval-worker] in
# CI at 300 s).
_FAST = [
    ("fork", "eval", "worker"),
    ("pool-fork", "eval", "worker"),
    ("pool-fork", "train", "none"),
    ("pool-forkserver", "train", "primary"),
    ("pool-spawn", "eval", "none"),
    ("ranks", "train", "worker"),
    ("ranks", "eval", "primary"),
]


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    lp = LocalPlatform(
        tmp_path_factory.mktemp("one-run-platform"), train_teams=[oracle.RANKS_TEAM, fo.TEAM]
    )
    lp.start()
    try:
        yield lp
    finally:
        lp.stop()


def _cell(lp: LocalPlatform, tmp: Path, topology: str, kind: str, fault: str) -> None:
    if topology == "ranks":
        oracle.ranks_trial(lp, tmp, kind, fault)
    else:
        one_run_family.family_trial(lp, tmp, topology, kind, fault)


@pytest.mark.parametrize(("topology", "kind", "fault"), _FAST)
def test_several_processes_land_every_record_once_and_the_primary_closes_the_run(
    platform: LocalPlatform, tmp_path: Path, topology: str, kind: str, fault: str
) -> None:
    _cell(platform, tmp_path, topology, kind, fault)


@pytest.mark.slow
@pytest.mark.parametrize(("topology", "kind", "fault"), [c for c in _ALL if c not in _FAST])
def test_several_processes_the_rest_of_the_matrix(
    platform: LocalPlatform, tmp_path: Path, topology: str, kind: str, fault: str
) -> None:
    _cell(platform, tmp_path, topology, kind, fault)


def test_processes_sharing_an_inherited_rank_close_the_run_once_after_every_record(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    oracle.inherited_rank_trial(platform, tmp_path)
