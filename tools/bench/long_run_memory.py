"""Long-run memory: the uplink's RSS over a 20,000-step online training run.

Run ``python tools/bench/long_run_memory.py`` (``--steps N`` for a shorter
or longer run, ``--quick``: 2,000 steps; ``--marks`` the steps to read it
at, e.g. ``--steps 100000 --marks 2000,20000,50000,100000``) from the
repository root. One online training
run is opened against a local platform on loopback (in this process); each
step logs one gsm8k episode as a training episode of that step and one
metrics row, so every sink of a training run ships (Prime Traces, the
training sample table every 10th step, the metrics rows). At each mark
(step 2,000, 5,000, 10,000 and 20,000 of the default run, the same fractions
of a shorter one) the loop flushes, so the uplink has shipped everything up
to that step, waits two seconds (the idle uplink's figure, not one taken in
the middle of its last batch), and the uplink process's VmRSS (split into anonymous and
file-backed pages: the journal's mapped pages count as the latter) is read
from ``/proc/PID/status``.

Reported: the RSS at each mark, its ratio to the first mark (the target of
issue #28: within 10% between step 2,000 and step 20,000), and the peak
(VmHWM) just before ``finish()``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import benchlib
from benchlib import API_KEY, TEAM, Table

import primeruns as pr

DEFAULT_STEPS = 20_000
MARKS = (0.1, 0.25, 0.5, 1.0)  # of the run: steps 2k, 5k, 10k, 20k by default
_BUDGET = 1.10  # RSS at the last mark over the first
_SETTLE_S = 2.0  # after a mark's flush, before its figure


def status_kb(pid: int) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/PID/status`` (VmRSS, RssAnon, RssFile, VmHWM)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[name] = int(parts[0])
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def uplink_pid() -> int:
    """The uplink process this one started (``python -m primeruns.ship.uplink_main``)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"primeruns.ship.uplink_main" in cmdline:
            return int(entry)
    raise SystemExit("no uplink process found (is the run online?)")


def measure(steps: int, at: list[int] | None = None) -> tuple[Table, bool]:
    episodes = benchlib.records("gsm8k-eval", 500)
    marks = sorted({min(steps, m) for m in at} if at else {max(1, int(steps * f)) for f in MARKS})
    rows: list[tuple[int, dict[str, int], float, float]] = []
    with (
        benchlib.isolated_env(None) as scratch,
        benchlib.local_platform(scratch / "platform") as server,
    ):
        os.environ["PRIME_TRACES_URL"] = server.url  # isolated_env puts it back
        run = pr.init(
            name="bench-long-run",
            kind="train",
            model="Qwen/Qwen3-8B",
            team_id=TEAM,
            api_key=API_KEY,
            base_url=server.url,
            training=pr.TrainingSpec(max_steps=steps),
            runs_dir=scratch / "runs",
        )
        pid = uplink_pid()
        t0 = time.perf_counter()
        for step in range(steps):
            episode = benchlib.renew_ids(dict(episodes[step % len(episodes)]), f"s{step}")
            episode["run"] = {"type": "train", "work": {"type": "train", "step": step}}
            run.log_episodes([episode])
            run.log_metrics(benchlib.metrics_row(step), step=step)
            if step + 1 in marks:
                if not run.flush(timeout=600):
                    raise SystemExit(f"the uplink did not catch up by step {step + 1}")
                # Shipped: each sink now finds nothing more and goes idle. The
                # figure is the idle uplink's, a moment after (not the middle
                # of its last batch).
                time.sleep(_SETTLE_S)
                rows.append((step + 1, status_kb(pid), time.perf_counter() - t0, cpu_s(pid)))
        peak = status_kb(pid).get("VmHWM", 0)
        run.finish()
        lost = run.dropped_records + sum(run.failed_records.values())
    first = rows[0][1]["VmRSS"]
    last = rows[-1][1]["VmRSS"]
    ok = last <= first * _BUDGET
    t = Table(
        f"Long run: the uplink's RSS over a {steps:,}-step online training run "
        "(1 episode + 1 metrics row per step)",
        [
            "step",
            "VmRSS MB",
            "RssAnon MB",
            "RssFile MB",
            "vs first mark",
            "elapsed s",
            "uplink CPU s",
        ],
    )
    for step, kb, elapsed, cpu in rows:
        t.add(
            f"{step:,}",
            f"{kb['VmRSS'] / 1024:.0f}",
            f"{kb.get('RssAnon', 0) / 1024:.0f}",
            f"{kb.get('RssFile', 0) / 1024:.0f}",
            f"{kb['VmRSS'] / first:.2f}",
            f"{elapsed:.0f}",
            f"{cpu:.0f}",
        )
    t.notes.append(f"peak (VmHWM) before finish(): {peak / 1024:.0f} MB")
    t.notes.append(
        f"RSS at step {rows[-1][0]:,} ÷ step {rows[0][0]:,} = {last / first:.2f}: "
        f"{benchlib.verdict(last / first, _BUDGET)}"
    )
    t.notes.append(f"records lost or failed: {lost}")
    t.notes.append(
        f"each mark: flush() first (the uplink has shipped up to that step), then {_SETTLE_S:g} s "
        "idle; elapsed includes those pauses"
    )
    return t, ok and lost == 0


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    """For ``run_all.py``: one run (a quick one of 2,000 steps)."""
    return [measure(2_000 if quick else DEFAULT_STEPS)[0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 steps")
    parser.add_argument("--steps", type=int, default=None, help="steps of the run")
    parser.add_argument("--marks", type=str, default=None, help="steps, comma-separated")
    parser.add_argument("--repeat", type=int, default=None, help="ignored (one run)")
    args = parser.parse_args(argv)
    steps = args.steps or (2_000 if args.quick else DEFAULT_STEPS)
    marks = [int(m) for m in args.marks.split(",")] if args.marks else None
    table, _ok = measure(steps, marks)
    benchlib.print_tables([table])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
