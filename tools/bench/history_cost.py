"""What past runs cost: a loop, ``ls`` and the dashboard with thousands of journals beside them.

    python tools/bench/history_cost.py [--runs 3000] [--rounds 3] [--before TREE] [--quick]

Every online ``init()`` looks at the earlier runs of its runs directory (the
crashed-run hint), the commands list them, and the offline dashboard shows
them: none of it may cost more as the runs directory fills up. This makes
``--runs`` past journals cheaply (one small online run, closed out on a local
platform, copied that many times, each with its own local id and origin, as
valid as the run it copies), then measures, in one run, with that history and
with an empty runs directory:

- the training loop of ``uplink_loop.py`` (``loop_worker.py``: pure-Python
  work, 8 gsm8k episodes and one metrics row per step, shipping online):
  its wall time, the per-step log p99 and the worst ``log_*`` step, as ratios
  history ÷ empty within each round (the hint's scan runs beside the loop);
- ``primeruns ls``, ``ls --json``, ``gc --dry-run`` and ``sync --all`` with
  nothing to do, each a fresh process;
- the offline dashboard (``serve --runs-dir``): the runs index, loaded and
  then reloaded, and a run's page, in one fresh process
  (``tests/local/dashboard_pages_rss.py``).

``--before TREE`` runs everything with the package of another checkout as
well (the code before a change), in rotating order, so both sets of figures
come from one run on one machine. The first listing of a history that no
listing has read yet is reported apart ("first ls"): it reads every journal
once; every figure after it is the steady state. Targets (issue #32): loop
and worst ``log_*`` step equal with and without history (within noise),
``ls`` under 1 s, the dashboard index under 0.5 s on reload.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import ROOT, Table

HERE = Path(__file__).resolve().parent
WORKER = HERE / "loop_worker.py"
PAGES = ROOT / "tests" / "local" / "dashboard_pages_rss.py"
WORK = 350_000  # pure-Python iterations per step, as uplink_loop.py: ~20 ms here
COMMANDS = {
    "ls": ["ls"],
    "ls --json": ["ls", "--json"],
    "gc --dry-run": ["gc", "--dry-run"],
    "sync --all": ["sync", "--all"],
}


def _python(tree: Path, url: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` with ``tree``'s package, from a folder where neither
    checkout's package is importable."""
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree), "PRIME_TRACES_URL": url},
        cwd=ROOT.parent,
        timeout=900,
        check=False,
    )


def loop(tree: Path, episodes: Path, url: str, runs: Path, steps: int) -> dict[str, Any]:
    """One online training loop with ``tree``'s package, journaling into ``runs``."""
    argv = [str(WORKER), "online", str(episodes), url, str(runs), str(steps), str(WORK)]
    done = _python(tree, url, argv)
    if done.returncode:
        raise RuntimeError(f"loop worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def template(scratch: Path, episodes: Path, url: str) -> Path:
    """A small online training run, finished and closed out: the journal to copy."""
    runs = scratch / "template"
    loop(ROOT, episodes, url, runs, 4)
    (journal,) = [p for p in runs.iterdir() if (p / "data.mdb").is_file()]
    return journal


def clone(source: Path, runs: Path, count: int) -> None:
    """``count`` copies of the journal ``source`` under ``runs``, each with its own
    local id (older than any run made later), its origin at its own path, and
    last written a month ago."""
    import lmdb

    from primeruns.journal import Journal
    from primeruns.journal.frames import encode_frame
    from primeruns.journal.layout import META_KIND, dumps
    from primeruns.journal.meta import K_LOCAL_ID
    from primeruns.journal.origin import K_ORIGIN, ORIGIN_FILE

    with Journal.open(source, owner=False) as journal:
        origin = dict(journal.get_meta(K_ORIGIN) or {})
    runs.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = [n for n in ("data.mdb", "owner.lock") if (source / n).exists()]
    month_ago = time.time() - 30 * 86400
    for i in range(count):
        name = f"20250101-{i // 3600 % 24:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:08x}"
        target = runs / name
        target.mkdir(mode=0o700)
        for file in files:
            shutil.copyfile(source / file, target / file)
            os.chmod(target / file, 0o600)
        moved = {**origin, "path": str(target.absolute())}
        env = lmdb.open(str(target), max_dbs=8, subdir=True, sync=False, metasync=False)
        try:
            meta = env.open_db(b"meta")
            with env.begin(write=True) as txn:
                txn.put(K_LOCAL_ID.encode(), encode_frame(META_KIND, dumps(name)), db=meta)
                txn.put(K_ORIGIN.encode(), encode_frame(META_KIND, dumps(moved)), db=meta)
        finally:
            env.close()
        (target / ORIGIN_FILE).write_text(json.dumps(moved))
        os.utime(target / "data.mdb", (month_ago, month_ago))  # past runs are old: gc's to judge


def command(tree: Path, url: str, runs: Path, args: list[str]) -> float:
    """Wall seconds of ``primeruns ARGS --runs-dir RUNS`` in a fresh process."""
    start = time.perf_counter()
    done = _python(tree, url, ["-m", "primeruns", *args, "--runs-dir", str(runs)])
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"primeruns {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return seconds


def dashboard(tree: Path, url: str, runs: Path, run_path: str) -> list[float]:
    """Seconds of the runs index, the index again, and a run's page, in one process."""
    done = _python(tree, url, [str(PAGES), str(runs), "/", "/", run_path])
    if done.returncode:
        raise RuntimeError(f"dashboard pages failed:\n{done.stderr[-2000:]}")
    pages = json.loads(done.stdout.strip().splitlines()[-1])["pages"]
    if {p["status"] for p in pages} != {200}:
        raise RuntimeError(f"dashboard pages failed: {pages}")
    return [float(p["seconds"]) for p in pages]


def run(
    quick: bool,
    repeat: int | None = None,
    *,
    count: int | None = None,
    before: Path | None = None,
) -> list[Table]:
    count = count or (300 if quick else 3000)
    rounds = repeat or (1 if quick else 3)
    steps = 60 if quick else 250
    trees = [("before", before.resolve())] if before is not None else []
    trees.append(("this tree", ROOT))
    lines = benchlib.raw_lines("gsm8k-eval")[:400]
    loops: dict[tuple[str, str], list[dict[str, Any]]] = {}
    cli: dict[tuple[str, str, str], list[float]] = {}
    pages: dict[tuple[str, str], list[list[float]]] = {}
    first_ls: dict[str, float] = {}
    with benchlib.isolated_env(None) as scratch:
        episodes = scratch / "episodes.jsonl"
        episodes.write_bytes(b"\n".join(lines) + b"\n")
        with benchlib.local_platform(scratch / "platform") as server:
            source = template(scratch, episodes, server.url)
            started = time.perf_counter()
            dirs = {"history": scratch / "history", "empty": scratch / "empty"}
            clone(source, dirs["history"], count)
            made_s = time.perf_counter() - started
            dirs["empty"].mkdir(mode=0o700)
            shown = min(p.name for p in dirs["history"].iterdir() if not p.name.startswith("."))
            run_path = f"/dashboard/training/{shown}"  # a past run's page
            for name, tree in trees:  # the first listing reads every journal once
                first_ls[name] = command(tree, server.url, dirs["history"], ["ls"])
            configs = [(t, h) for t in trees for h in dirs]
            for round_ in range(rounds):
                shift = round_ % len(configs)
                for (name, tree), history in configs[shift:] + configs[:shift]:
                    runs = dirs[history] if history == "history" else scratch / f"empty-{round_}"
                    loops.setdefault((name, history), []).append(
                        loop(tree, episodes, server.url, runs, steps)
                    )
                    for label, args in COMMANDS.items():
                        cli.setdefault((name, history, label), []).append(
                            command(tree, server.url, dirs[history], args)
                        )
                    if history == "history":
                        pages.setdefault((name, history), []).append(
                            dashboard(tree, server.url, dirs[history], run_path)
                        )
    tables = [_loop_table(loops, trees, count, steps, rounds)]
    tables.append(_listing_table(cli, pages, first_ls, trees, count, made_s))
    return tables


def _loop_table(
    loops: dict[tuple[str, str], list[dict[str, Any]]],
    trees: list[tuple[str, Path]],
    count: int,
    steps: int,
    rounds: int,
) -> Table:
    table = Table(
        f"An online training loop ({steps} steps) with {count:,} past journals in its runs "
        "directory vs none",
        [
            "code",
            "loop s (none)",
            "loop s (history)",
            "loop history ÷ none",
            "log p99 ms (none / history)",
            "worst log ms (none / history)",
            "worst log history ÷ none",
        ],
    )
    for name, _ in trees:
        empty, full = loops[(name, "empty")], loops[(name, "history")]
        loop_ratio = statistics.median(
            f["loop_s"] / e["loop_s"] for e, f in zip(empty, full, strict=True)
        )
        worst = [max(r["logs_s"]) * 1000 for r in empty], [max(r["logs_s"]) * 1000 for r in full]
        p99 = (
            [benchlib.pcts(r["logs_s"])[1] * 1000 for r in empty],
            [benchlib.pcts(r["logs_s"])[1] * 1000 for r in full],
        )
        table.add(
            name,
            f"{statistics.median(r['loop_s'] for r in empty):.2f}",
            f"{statistics.median(r['loop_s'] for r in full):.2f}",
            f"{loop_ratio:.2f}",
            f"{statistics.median(p99[0]):.2f} / {statistics.median(p99[1]):.2f}",
            f"{statistics.median(worst[0]):.1f} / {statistics.median(worst[1]):.1f}",
            f"{statistics.median(worst[1]) / statistics.median(worst[0]):.2f}",
        )
    table.notes.append(
        f"medians of {rounds} round(s), configurations in rotating order; each loop a fresh "
        "process shipping to one local platform; ratios within each round"
    )
    return table


def _listing_table(
    cli: dict[tuple[str, str, str], list[float]],
    pages: dict[tuple[str, str], list[list[float]]],
    first_ls: dict[str, float],
    trees: list[tuple[str, Path]],
    count: int,
    made_s: float,
) -> Table:
    table = Table(
        f"Listing {count:,} past journals: seconds (history ÷ empty runs directory)",
        ["code", "first ls", *COMMANDS, "dashboard index", "index reload", "a run's page"],
    )
    for name, _ in trees:
        cells = [f"{first_ls[name]:.2f}"]
        for label in COMMANDS:
            full = statistics.median(cli[(name, "history", label)])
            empty = statistics.median(cli[(name, "empty", label)])
            cells.append(f"{full:.2f} ({full / empty:.1f}x)")
        shown = pages[(name, "history")]
        cells += [f"{statistics.median(p[i] for p in shown):.2f}" for i in range(3)]
        table.add(name, *cells)
    table.notes += [
        "each command a fresh process (its interpreter and imports included); "
        "the dashboard's pages in one process, in order",
        f"the past journals were made in {made_s:.1f} s (copies of one closed-out online run)",
        "targets: ls < 1 s; index reload < 0.5 s",
    ]
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="300 journals, 60 steps, 1 round")
    parser.add_argument("--runs", type=int, default=None, help="past journals (default 3000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (medians are reported)")
    parser.add_argument(
        "--before", type=benchlib.as_installed_arg, help="a checkout whose package runs as well"
    )
    args = parser.parse_args(argv)
    benchlib.print_tables(run(args.quick, args.rounds, count=args.runs, before=args.before))


if __name__ == "__main__":
    main()
