"""Finish latency: how long ``run.finish()`` takes, empty and with a backlog.

Run ``python tools/bench/finish_latency.py`` (``--quick``: one repetition)
from the repository root. Against a local platform on loopback, an eval run:

- *empty backlog*: 50 episodes logged and ``flush()``-ed, then ``finish()``;
- *1,000 pending*: 1,000 gsm8k episodes logged as fast as possible, then
  ``finish()`` at once, so it drains them.

Each case runs in a fresh process twice: shipped by the uplink process (as
the SDK ships) and by threads in the producer (the fallback,
``PRIME_RUNS_UPLINK=threads``), so the ratio shows what the separate process
costs at the end of a run (its start-up, then its exit). The reference for
the pending case is the one-stream upload of the same 1,000 records
(``replay.one_stream``) in the same run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchlib
from benchlib import API_KEY, Table

HERE = Path(__file__).resolve().parent
CASES = {"empty backlog": 0, "1,000 pending": 1000}
VARIANTS = ("uplink process", "threads")
#: The reference's sample pushes: about the rows the sample sink sends in
#: one when it drains a backlog (replay.py records them: ~250).
_ROWS_PER_PUSH = 250


def _pushes(rows: int) -> list[int]:
    """``rows`` in pushes of ``_ROWS_PER_PUSH``."""
    return [min(_ROWS_PER_PUSH, rows - start) for start in range(0, rows, _ROWS_PER_PUSH)]


def child(case_pending: int, variant: str, url: str, runs_dir: str) -> float:
    """In a worker process: one run, returns finish() seconds."""
    if variant == "threads":
        os.environ["PRIME_RUNS_UPLINK"] = "threads"
    import primeruns as pr

    episodes = benchlib.records("gsm8k-eval", max(case_pending, 50))
    run = pr.init(
        name="bench-finish",
        environments=["gsm8k"],
        model="Qwen/Qwen3-8B",
        api_key=API_KEY,
        base_url=url,
        runs_dir=runs_dir,
    )
    if case_pending == 0:
        for episode in episodes[:50]:
            run.log_episodes([episode])
        run.flush(timeout=60)
    else:
        for episode in episodes[:case_pending]:
            run.log_episodes([episode])
    t0 = time.perf_counter()
    run.finish(timeout=120)
    return time.perf_counter() - t0


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    repeats = repeat or (1 if quick else 3)
    times: dict[tuple[str, str], list[float]] = {}
    from replay import one_stream

    with benchlib.isolated_env(None) as scratch:
        with benchlib.local_platform(scratch / "platform") as server:
            env = dict(os.environ, PRIME_TRACES_URL=server.url)
            for _ in range(repeats):
                for case, pending in CASES.items():
                    for variant in VARIANTS:
                        out = subprocess.run(
                            [
                                sys.executable,
                                __file__,
                                "--child",
                                json.dumps([pending, variant, server.url, str(scratch / "runs")]),
                            ],
                            capture_output=True,
                            text=True,
                            env=env,
                            timeout=300,
                        )
                        if out.returncode != 0:
                            raise RuntimeError(f"finish child failed:\n{out.stderr[-3000:]}")
                        seconds = float(out.stdout.strip().splitlines()[-1])
                        times.setdefault((case, variant), []).append(seconds)
            pending = CASES["1,000 pending"]
            traces, samples, *_ = one_stream(server, pending, _pushes(pending))
            stream_s = traces.wall_s + samples.wall_s
    table = Table(
        "Finish latency: run.finish() on an online eval run (local platform, loopback)",
        [
            "case",
            "shipped by",
            "finish ms (median)",
            "÷ uplink process",
            "÷ one-stream upload",
            "spread",
        ],
    )
    for case in CASES:
        base = statistics.median(times[(case, "uplink process")])
        for variant in VARIANTS:
            value = statistics.median(times[(case, variant)])
            ref = f"{value / stream_s:.1f}" if CASES[case] else "-"
            table.add(
                case,
                variant,
                f"{value * 1000:.0f}",
                f"{value / base:.2f}",
                ref,
                benchlib.spread(times[(case, variant)]),
            )
    table.notes += [
        f"one-stream upload of the same 1,000 records: {stream_s * 1000:.0f} ms",
        f"median of {repeats} run(s), each in a fresh process",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        pending, variant, url, runs_dir = json.loads(argv[1])
        print(child(int(pending), str(variant), str(url), str(runs_dir)))
        return
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
