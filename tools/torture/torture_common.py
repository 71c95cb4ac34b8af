"""Shared plumbing of the long torture runs: the trial code lives beside the
bounded CI tests (``tests/reliability/rel_*.py``) so both exercise one
implementation; this puts it on the path, starts a local platform, runs the
trials and prints the results row (and every failing seed)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "reliability"), str(ROOT / "tests")]

import rel_torture as rt  # noqa: E402

from primeruns.local import LocalPlatform  # noqa: E402

Trial = rt.Trial
__all__ = ["Trial", "TrialFn", "parse", "rt", "run_trials"]
TrialFn = Callable[[int, Path, LocalPlatform], rt.Trial]


def parse(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--trials", type=int, default=20, help="how many trials (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="first seed; trial i uses seed+i")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args()


def run_trials(family: str, trial: TrialFn, args: argparse.Namespace) -> int:
    """Run ``args.trials`` seeded trials; print one row; 0 if all passed."""
    work = Path(tempfile.mkdtemp(prefix=f"torture-{family}-"))
    platform = LocalPlatform(work / "platform").start()
    trials: list[rt.Trial] = []
    started = time.monotonic()
    try:
        for i in range(args.trials):
            seed = args.seed + i
            try:
                result = trial(seed, work / f"t{seed}", platform)
            except Exception as exc:  # a harness failure is a crash of the trial
                result = rt.Trial(family, seed, "harness")
                result.crashes += 1
                result.fail(f"trial raised {type(exc).__name__}: {exc}")
            trials.append(result)
            mark = "ok" if result.ok else "FAIL"
            print(f"  seed={seed:<6} {result.variant:<22} {mark}", flush=True)
            for problem in result.problems:
                print(f"    {problem}", flush=True)
    finally:
        platform.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    s = rt.summarize(trials)
    print(
        f"| {family} | {s['trials']} trials (seeds {args.seed}..{args.seed + args.trials - 1}) "
        f"| {s['records']} records | {s['faults']} faults injected | lost {s['lost']} "
        f"| duplicates {s['duplicates']} | crashes {s['crashes']} | failed trials {s['failed']} "
        f"| {time.monotonic() - started:.0f} s |"
    )
    failed = [t.seed for t in trials if not t.ok]
    if failed:
        print(f"failing seeds: {failed}", file=sys.stderr)
    return 1 if failed else 0
