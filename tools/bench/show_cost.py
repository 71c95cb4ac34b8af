"""What ``primeruns show`` costs on a small and on a long run, and a Parquet
``export`` of the long run's metrics: seconds and peak RSS.

    python tools/bench/show_cost.py [--steps 100000] [--small 200] [--before TREE] [--repeat 3]

Writes two offline training runs under a temporary runs dir with the SDK
(each step: one gsm8k episode as a training episode of that step, one
10-scalar metrics row, one summary update), one of ``--small`` steps and one
of ``--steps``, then runs ``primeruns show`` on each in a fresh process and
reports its wall seconds and peak RSS (``ru_maxrss`` of the child; the
journal's pages mapped and read count there too), the median of
``--repeat`` runs each. ``--before TREE`` runs the same commands with the
package of another checkout first (the code before a change), so both
figures come from one run on one machine.
The ratio long/small is the figure of issue #28 (``show`` reads what it
prints, not the whole journal); the long run's peak RSS is issue #32's
(under 150 MB at 100,000 steps). ``--full`` is the exhaustive check kept
for when a user asks for it. The export writes the long run's metric rows
as Parquet a batch at a time: its peak RSS is held to the same 150 MB.
``run_all.py`` runs it with 100,000 steps (``--quick``: 2,000).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import ROOT, Table


def write_run(runs: Path, steps: int) -> Path:
    """An offline training run of ``steps`` steps under ``runs``; its journal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / "tools" / "bench")!r})
import primeruns as pr
from benchlib import metrics_row, records, renew_ids
base = records("gsm8k-eval", 500)
run = pr.init(name="long-train", kind="train", model="m", mode="offline", team_id="team-bench",
              training=pr.TrainingSpec(max_steps={steps}), runs_dir={str(runs)!r})
for step in range({steps}):
    episode = renew_ids(dict(base[step % len(base)]), f"s{{step}}")
    episode["run"] = {{"type": "train", "work": {{"type": "train", "step": step}}}}
    run.log_episodes([episode])
    run.log_metrics(metrics_row(step), step=step)
    run.update_summary({{"best": step}})
run.finish(summary={{"avg_reward": 0.5}})
print(run.journal_path)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"writing the run failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def command(tree: Path, *args: str) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, exit code) of ``primeruns ARGS`` with
    ``tree``'s package."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode not in (0, 4):
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, peak / 1024, done.returncode


LONG_RSS_MB = 150.0  # issue #32: ``show`` of a 100,000-step run


def run(
    quick: bool,
    repeat: int | None = None,
    *,
    steps: int | None = None,
    small_steps: int = 200,
    before: Path | None = None,
) -> list[Table]:
    steps = steps or (2_000 if quick else 100_000)
    repeats = repeat or (1 if quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir(mode=0o700)
        small, long = write_run(runs, small_steps), write_run(runs, steps)
        size = sum(f.stat().st_size for f in long.iterdir() if f.is_file())
        table = Table(
            f"primeruns show: a {small_steps}-step and a {steps:,}-step offline training run",
            ["code", "small (s)", "long (s)", "long ÷ small", "small RSS (MB)", "long RSS (MB)"],
        )
        cases: list[tuple[str, Path, tuple[str, ...]]] = []
        if before:
            cases.append(("before", before, ()))
        cases += [("this tree", ROOT, ()), ("this tree, --full", ROOT, ("--full",))]
        for name, tree, extra in cases:
            # Peak RSS is a maximum over every child so far: the smaller run
            # goes in its own interpreter so its figure is its own.
            s_small, rss_small = _median(tree, ("show", str(small), *extra), repeats)
            s_long, rss_long = _median(tree, ("show", str(long), *extra), repeats)
            if name == "this tree":
                shown = benchlib.verdict(rss_long, LONG_RSS_MB)
                table.notes.append(f"this tree's long run, peak RSS {rss_long:.0f} MB: {shown}")
            table.add(
                name,
                f"{s_small:.2f}",
                f"{s_long:.2f}",
                f"{s_long / s_small:.1f}x",
                f"{rss_small:.0f}",
                f"{rss_long:.0f}",
            )
        exported = Table(
            f"primeruns export --kind metrics -o FILE.parquet: the {steps:,}-step run",
            ["code", "seconds", "peak RSS (MB)"],
        )
        parquet = str(Path(tmp) / "metrics.parquet")
        for name, tree, _ in cases[:-1]:
            args = ("export", str(long), "--kind", "metrics", "-o", parquet)
            seconds, rss = _median(tree, args, repeats)
            exported.add(name, f"{seconds:.2f}", f"{rss:.0f}")
            if name == "this tree":
                shown = benchlib.verdict(rss, LONG_RSS_MB)
                exported.notes.append(f"this tree's export, peak RSS {rss:.0f} MB: {shown}")
    table.notes += [
        f"the long run's journal: {size / 1e6:.1f} MB on disk (each step: a gsm8k episode, "
        "a metrics row, a summary update)",
        f"each figure the median of {repeats} run(s), each a fresh process; peak RSS is the "
        "child's ru_maxrss (the journal's pages it mapped and read count there)",
    ]
    return [table, exported]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="steps of the long run")
    parser.add_argument("--small", type=int, default=200, help="steps of the small run")
    parser.add_argument(
        "--before", type=benchlib.as_installed_arg, help="a checkout whose package runs first"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (the median)")
    args = parser.parse_args()
    tables = run(False, args.repeat, steps=args.steps, small_steps=args.small, before=args.before)
    for table in tables:
        print(table.text())
    return 0


def _median(tree: Path, args: tuple[str, ...], repeat: int) -> tuple[float, float]:
    """The median seconds and peak RSS of ``repeat`` runs (the machine may be shared)."""
    runs = [_fresh(tree, args) for _ in range(max(1, repeat))]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def _fresh(tree: Path, args: tuple[str, ...]) -> tuple[float, float]:
    """``primeruns ARGS`` measured from a fresh interpreter (its own children's peak RSS)."""
    code = (
        "import sys, pathlib; sys.path.insert(0, sys.argv[1]); import show_cost\n"
        "seconds, rss, _ = show_cost.command(pathlib.Path(sys.argv[2]), *sys.argv[3:])\n"
        "print(seconds, rss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(tree), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, rss = done.stdout.split()
    return float(seconds), float(rss)


if __name__ == "__main__":
    sys.exit(main())
