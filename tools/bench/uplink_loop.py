"""The user's loop with shipping beside it: this SDK against the vendor's, in one run.

Run ``python tools/bench/uplink_loop.py`` (``--quick``: 60 steps, one round)
from the repository root. A training-like loop (``loop_worker.py``: pure-Python
work per step, then ``log_episodes`` of 8 gsm8k episodes and one
``log_metrics`` row; 250 steps) runs in a fresh process per producer, against
one ``primeruns serve`` on loopback, producers in rotating order:

- ``none``: the loop alone (the reference);
- ``offline``: this SDK, journal only;
- ``online``: this SDK as shipped (the uplink process ships);
- ``threads``: this SDK shipping from threads in the producer (the fallback);
- ``vendor``: ``prime-runs`` 0.1.4 in its own virtual environment
  (``tools/bench/.venv-vendor``, created on first use).

Reported per producer (medians over the rounds): the loop's slowdown against
``none`` in the same round, the per-step log time (p50, p99), init→finish
wall time (everything acknowledged: ``finish()`` returns once the run is
closed out), and CPU seconds of the producer and of its children (the uplink).
The targets (issue "The uplink"): online slowdown ≤ vendor's + 5 points and ≤
offline's + 10 points; online per-step log p99 ≤ 2 ms; online init→finish ≤
the vendor's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Table
from end_to_end import vendor_python

HERE = Path(__file__).resolve().parent
WORKER = HERE / "loop_worker.py"
SDKS = ("none", "offline", "online", "threads", "vendor")
WORK = 350_000  # pure-Python iterations per step: ~20 ms on this machine


def run_worker(
    sdk: str, episodes: Path, url: str, scratch: Path, steps: int, env: dict[str, str]
) -> dict[str, Any]:
    python = str(vendor_python()) if sdk == "vendor" else sys.executable
    runs_dir = scratch / "runs" / sdk
    proc = subprocess.run(
        [python, str(WORKER), sdk, str(episodes), url, str(runs_dir), str(steps), str(WORK)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{sdk} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check_landed(server: Any, sdk: str, out: dict[str, Any], steps: int) -> None:
    if sdk in ("none", "offline"):
        return
    stored = server.run(out["run_id"])
    metrics = (stored.get("train_metrics") or {}).get("steps")
    if metrics != steps:
        raise RuntimeError(f"{sdk}: {metrics} of {steps} metric steps landed")


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    steps = 60 if quick else 250
    repeats = repeat or (1 if quick else 3)
    vendor_python()
    lines = benchlib.raw_lines("gsm8k-eval")[:400]
    results: dict[str, list[dict[str, Any]]] = {sdk: [] for sdk in SDKS}
    with benchlib.isolated_env(None) as scratch:
        episodes = scratch / "episodes.jsonl"
        episodes.write_bytes(b"\n".join(lines) + b"\n")
        with benchlib.local_platform(scratch / "platform") as server:
            env = dict(os.environ, PRIME_TRACES_URL=server.url)
            for round_ in range(repeats):
                order = SDKS[round_ % len(SDKS) :] + SDKS[: round_ % len(SDKS)]
                outs = {}
                for sdk in order:
                    out = run_worker(sdk, episodes, server.url, scratch, steps, env)
                    check_landed(server, sdk, out, steps)
                    outs[sdk] = out
                for sdk, out in outs.items():
                    out["slowdown"] = out["loop_s"] / outs["none"]["loop_s"] - 1.0
                    results[sdk].append(out)
    return [_table(results, steps, repeats)]


def _table(results: dict[str, list[dict[str, Any]]], steps: int, repeats: int) -> Table:
    def med(sdk: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[sdk]))

    def log_pct(sdk: str) -> tuple[float, float]:
        p50s, p99s = [], []
        for r in results[sdk]:
            p50, p99 = benchlib.pcts(r["logs_s"])
            p50s.append(p50)
            p99s.append(p99)
        return statistics.median(p50s), statistics.median(p99s)

    def own_p99(sdk: str) -> float:
        return statistics.median(benchlib.pcts(benchlib.own_times(r))[1] for r in results[sdk])

    table = Table(
        f"The loop with shipping beside it: {steps} steps of work + 8 gsm8k episodes + "
        "1 metrics row, one local platform on loopback",
        [
            "producer",
            "loop slowdown vs none",
            "log p50 ms",
            "log p99 ms",
            "p99 less CPU wait ms",
            "init→finish s",
            "producer CPU s",
            "uplink CPU s",
            "spread (slowdown)",
        ],
    )
    for sdk in SDKS:
        p50, p99 = log_pct(sdk)
        table.add(
            sdk,
            f"{med(sdk, 'slowdown') * 100:+.0f}%",
            f"{p50 * 1000:.2f}",
            f"{p99 * 1000:.2f}",
            f"{own_p99(sdk) * 1000:.2f}",
            f"{med(sdk, 'init_to_finish_s'):.2f}",
            f"{med(sdk, 'cpu_s'):.2f}",
            f"{med(sdk, 'child_cpu_s'):.2f}",
            benchlib.spread([r["slowdown"] * 100 for r in results[sdk]]),
        )
    online, vendor, offline = (med(s, "slowdown") * 100 for s in ("online", "vendor", "offline"))
    p99 = log_pct("online")[1] * 1000
    e2e = med("online", "init_to_finish_s") / med("vendor", "init_to_finish_s")
    table.notes += [
        f"online slowdown {online:+.0f}% vs vendor {vendor:+.0f}% (+5 points allowed): "
        f"{benchlib.verdict(online, vendor + 5)}",
        f"online slowdown {online:+.0f}% vs offline {offline:+.0f}% (+10 points allowed): "
        f"{benchlib.verdict(online, offline + 10)}",
        f"online log p99 {p99:.2f} ms (≤ 2 ms): {benchlib.verdict(p99, 2.0)}",
        f"online ÷ vendor init→finish = {e2e:.2f} (≤ 1): {benchlib.verdict(e2e, 1.0)}",
        f"median of {repeats} round(s), producers in rotating order; every online run "
        "verified on the server (every metrics step landed)",
        "uplink CPU = the producer's reaped children (this SDK online: the uplink process)",
        "p99 less CPU wait: of each log time, the part its thread spent runnable and waiting "
        "for a CPU taken out (Linux's schedstat): where it is far below the p99, the host's "
        "other work made the p99, not the SDK",
    ]
    return table


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
