"""What ``primeruns show`` costs on a small and on a long run: seconds and peak RSS.

    python tools/bench/show_cost.py [--steps 20000] [--small 200] [--before TREE] [--repeat 3]

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
prints, not the whole journal); ``--full`` is the exhaustive check kept for
when a user asks for it.
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
from benchlib import ROOT


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


def show(tree: Path, journal: Path, *extra: str) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, exit code) of ``primeruns show JOURNAL`` with
    ``tree``'s package."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", "show", str(journal), *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode not in (0, 4):
        raise SystemExit(f"show failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, peak / 1024, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps of the long run")
    parser.add_argument("--small", type=int, default=200, help="steps of the small run")
    parser.add_argument(
        "--before", type=benchlib.as_installed_arg, help="a checkout whose package runs first"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (the median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir(mode=0o700)
        small, long = write_run(runs, args.small), write_run(runs, args.steps)
        size = sum(f.stat().st_size for f in long.iterdir() if f.is_file())
        print(f"small: {args.small} steps; long: {args.steps} steps ({size / 1e6:.1f} MB on disk)")
        print("| code | small (s) | long (s) | long ÷ small | small RSS (MB) | long RSS (MB) |")
        print("|---|---|---|---|---|---|")
        cases: list[tuple[str, Path, tuple[str, ...]]] = []
        if args.before:
            cases.append(("before", args.before, ()))
        cases += [("this tree", ROOT, ()), ("this tree, --full", ROOT, ("--full",))]
        for name, tree, extra in cases:
            # Peak RSS is a maximum over every child so far: the smaller run
            # goes in its own interpreter so its figure is its own.
            s_small, rss_small = _median(tree, small, extra, args.repeat)
            s_long, rss_long = _median(tree, long, extra, args.repeat)
            print(
                f"| {name} | {s_small:.2f} | {s_long:.2f} | {s_long / s_small:.1f}x "
                f"| {rss_small:.0f} | {rss_long:.0f} |"
            )
    return 0


def _median(tree: Path, journal: Path, extra: tuple[str, ...], repeat: int) -> tuple[float, float]:
    """The median seconds and peak RSS of ``repeat`` runs (the machine may be shared)."""
    runs = [_fresh(tree, journal, extra) for _ in range(max(1, repeat))]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def _fresh(tree: Path, journal: Path, extra: tuple[str, ...]) -> tuple[float, float]:
    """``show`` measured from a fresh interpreter (its own children's peak RSS)."""
    code = (
        "import sys, pathlib; sys.path.insert(0, sys.argv[1]); import show_cost\n"
        "tree, journal = map(pathlib.Path, sys.argv[2:4])\n"
        "seconds, rss, _ = show_cost.show(tree, journal, *sys.argv[4:])\n"
        "print(seconds, rss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(tree), str(journal), *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, rss = done.stdout.split()
    return float(seconds), float(rss)


if __name__ == "__main__":
    sys.exit(main())
