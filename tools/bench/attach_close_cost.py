"""What past runs cost the close-out of a run attached by id (ranks' primary).

    python tools/bench/attach_close_cost.py [--runs 3000] [--rounds 3] [--tree TREE]

A torchrun or SLURM job's processes attach to one run by id (``init(id=)``);
its primary's close-out looks for the run's other processes in the runs
directory (``ranks.others_of``). That look must not cost more as the runs
directory fills up with past runs (DESIGN invariant 12). This makes
``--runs`` past journals as ``history_cost.py`` does (one small online run
copied), and measures, with that history and with an empty runs directory:

- ``others_of`` of a journal attached to a run by id, in one fresh process
  (the first look at a history no listing read yet, then the steady state);
- a whole attached primary: ``init(id=)`` and ``finish()``, each in seconds,
  in a fresh process against a local platform.

``--tree``: the package of another checkout (the code before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import API_KEY, ROOT
from history_cost import clone

_LOOK = """
import json, sys, time
from pathlib import Path
from primeruns import ranks
from primeruns.journal import Journal
from primeruns.spec import SPEC_KEY, RunSpec

runs, run_id = Path(sys.argv[1]), sys.argv[2]
spec = RunSpec(kind="train", name="bench", attach_id=run_id)
journal = Journal.create(runs, meta={SPEC_KEY: spec.to_json()})
times = []
for _ in range(3):
    t0 = time.perf_counter()
    ranks.others_of(journal, run_id, own_children=False)
    times.append(time.perf_counter() - t0)
journal.close()
print(json.dumps(times))
"""

_ATTACH = """
import json, sys, time
import primeruns as pr

runs, url, key = sys.argv[1], sys.argv[2], sys.argv[3]
common = dict(kind="train", model="m", team_id="team-bench", api_key=key, base_url=url)
created = pr.init(name="bench", runs_dir=runs, **common)
created.log_metrics({"loss": 1.0}, step=0)
created.finish(timeout=120)
t0 = time.perf_counter()
run = pr.init(id=created.id, runs_dir=runs, **common)
t1 = time.perf_counter()
run.log_metrics({"loss": 0.5}, step=1)
run.finish(timeout=120)
t2 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t1]))
"""


def _child(tree: Path, code: str, *args: str) -> Any:
    env = {**os.environ, "PYTHONPATH": str(tree), "RANK": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT.parent,
        timeout=900,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _template(runs: Path, url: str) -> Path:
    """A small online training run, finished and closed out: the journal to copy."""
    code = (
        "import sys, primeruns as pr\n"
        "run = pr.init(kind='train', name='past', model='m', team_id='team-bench',\n"
        "    api_key=sys.argv[2], base_url=sys.argv[1], runs_dir=sys.argv[3])\n"
        "run.log_metrics({'loss': 1.0}, step=0)\n"
        "run.finish(timeout=120)\n"
        "print('[]')\n"
    )
    _child(ROOT, code, url, API_KEY, str(runs))
    (journal,) = [p for p in runs.iterdir() if (p / "data.mdb").is_file()]
    return journal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=ROOT)
    args = parser.parse_args()
    with benchlib.isolated_env(None), tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        with benchlib.local_platform(scratch / "platform") as server:
            os.environ["PRIME_TRACES_URL"] = server.url
            source = _template(scratch / "template", server.url)
            t0 = time.perf_counter()
            clone(source, scratch / "history", args.runs)
            print(f"made {args.runs} past journals in {time.perf_counter() - t0:.1f} s")
            (scratch / "empty").mkdir(mode=0o700)
            rows: dict[str, dict[str, list[float]]] = {}
            for r in range(args.rounds):
                for name in ("empty", "history"):
                    runs = scratch / name
                    look = _child(args.tree, _LOOK, str(runs), f"run-{r}")
                    init_s, finish_s = _child(args.tree, _ATTACH, str(runs), server.url, API_KEY)
                    row = rows.setdefault(name, {})
                    row.setdefault("others_of, first", []).append(look[0])
                    row.setdefault("others_of, again", []).append(statistics.median(look[1:]))
                    row.setdefault("init(id=)", []).append(init_s)
                    row.setdefault("finish()", []).append(finish_s)
    print(f"seconds, per round: empty runs dir | {args.runs} past runs")
    for what in rows["empty"]:
        empty = " ".join(f"{v:.3f}" for v in rows["empty"][what])
        full = " ".join(f"{v:.3f}" for v in rows["history"][what])
        print(f"{what:18} {empty:>22} | {full}")


if __name__ == "__main__":
    main()
