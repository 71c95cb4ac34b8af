"""Processes of one run key started at once, finishing with the default timeout.

A run key is for a job's requeues, one after another; yet nothing stops a
job from starting several processes of one key at once (torchrun, srun, or
a launcher that gives no rank). Each registered the key's run as its creator would, so each
was a primary: each one's close-out waited for the others' journals, all
held while they waited too, so every process sat out the stall allowance
(or its whole ``finish_timeout``), and the first to give up closed the run
while the others still shipped. One of them is now the run's primary on
this host (the first to take the key's lock, as the first to attach a run
by id is), and the others finish once their own records are shipped.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from fork_oracle import TEAM
from rel_helpers import bound_run_id, isolated_env
from rel_run_key import at_once
from sdk_helpers import platform_metric_steps

from primeruns.journal import Journal
from primeruns.local import LocalPlatform
from primeruns.ranks import Role
from primeruns.ship.ledger import read_closeout

_KEY = "test-key-0123456789"
_PROCESSES = 3
_STEPS = 3

# argv: runs dir, base url, API key, run name (also the run key), index,
# the team, and "rank" for the launcher to give it rank ``index`` (RANK).
# Logs _STEPS metrics rows at steps of its own and finishes with the default
# timeout; prints its journal, how long finish() took and the failures its
# run recorded.
_PROCESS = """
import os, sys, time
runs, url, key, name, index, team, ranked = sys.argv[1:8]
if ranked == "rank":
    os.environ["RANK"] = index
import primeruns as pr
run = pr.init(kind="train", name=name, model="m", team_id=team, run_key=name,
              training=pr.TrainingSpec(max_steps=3, batch_size=1),
              api_key=key, base_url=url, runs_dir=runs)
for step in range(3):
    run.log_metrics({"loss": 1.0}, step=100 * int(index) + step)
began = time.monotonic()
run.finish()
print("journal", run.journal_path, flush=True)
print("took", f"{time.monotonic() - began:.2f}", flush=True)
print("errors", " | ".join(run.errors), flush=True)
"""


@pytest.mark.parametrize("ranked", ["no-rank", "rank"])
def test_processes_of_a_run_key_at_once_close_the_run_once_when_all_shipped(
    train_platform: LocalPlatform, tmp_path: Path, ranked: str
) -> None:
    """Three processes of one run key at once, with no rank or with a
    launcher's RANK: one of them is the primary (rank 0 where ranks are
    given), whose close-out finds every other journal shipped and let go
    (none left behind); the run is COMPLETED with each row once, and no
    process's run records a failure. On main each was a primary, and each
    one's close-out left the others behind (with ranks, twice over)."""
    lp = train_platform
    name = f"key-at-once-{ranked}"
    env = isolated_env(tmp_path, {"PRIME_TRACES_URL": lp.url})
    for var in ("RANK", "SLURM_PROCID", "PRIME_RUNS_PRIMARY"):
        env.pop(var, None)
    argvs = [
        [
            sys.executable,
            "-c",
            _PROCESS,
            *(str(tmp_path / "runs"), lp.url, _KEY, name, str(index), TEAM, ranked),
        ]
        for index in range(_PROCESSES)
    ]
    said = at_once(argvs, env, 600)
    print("finish() took", [s["took"] for s in said])
    journals = [Path(s["journal"]) for s in said]
    assert [s.get("errors", "") for s in said] == [""] * _PROCESSES
    run_ids = {bound_run_id(journal) for journal in journals}
    assert len(run_ids) == 1 and None not in run_ids
    (run_id,) = run_ids
    assert run_id is not None
    roles, closeouts = [], []
    for path in journals:
        journal = Journal.open(path, owner=False)
        try:
            roles.append(Role.of(journal))
            closeouts.append(read_closeout(journal))
        finally:
            journal.close()
    assert all(c is not None and c.drained and not c.others_left for c in closeouts)
    assert [role is not None and role.primary for role in roles].count(True) == 1
    if ranked == "rank":
        assert roles[0] is not None and roles[0].primary and roles[0].rank == 0
    assert lp.run(run_id)["status"] == "COMPLETED"
    expected = Counter(100 * index + step for index in range(_PROCESSES) for step in range(_STEPS))
    assert platform_metric_steps(lp.data_dir, run_id) == expected
