"""An evaluation's loop with shipping beside it: its first seconds, and after.

Run ``python tools/bench/eval_loop.py`` (``--quick``: 60 steps, one round)
from the repository root. An evaluation ships from threads in its producer
while its uplink process starts (``ship.startup``: from ``init()`` until the
process is ready and the threads caught up, a few seconds), then from that
process. This measures what the loop pays meanwhile: ``loop_worker.py`` with
``LOOP_KIND=eval`` (pure-Python work per step, ~20 ms, then
``log_episodes`` of 8 gsm8k evaluation episodes; 250 steps, ~5 s) in a fresh
process per producer, against one ``primeruns serve`` on loopback,
producers in rotating order:

- ``none``: the loop alone (the reference);
- ``offline``: this SDK, journal only;
- ``online``: this SDK as shipped (threads first, then the uplink process);
- ``vendor``: ``prime-runs`` 0.1.4, which ships from a thread in the
  producer throughout.

Reported per producer (medians over the rounds): the loop's slowdown
against ``none`` in the same round; the log call's p50 and p99 over the
whole loop, over its first ``EARLY_S`` seconds (this SDK's threads then ship
beside the loop) and over the rest; init→finish. Every online run is checked
on the server (each episode in Prime Traces). The bar ("never worse than the
vendor's SDK"): online's slowdown and its p99 in the first seconds no worse
than the vendor's (within 5 points and 1 ms).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import benchlib
from benchlib import Table
from end_to_end import check_landed, vendor_python
from uplink_loop import run_worker

SDKS = ("none", "offline", "online", "vendor")
PER_STEP = 8
EARLY_S = 2.0  # this SDK's threads' phase: WARM at 1 s, the process's imports, a catch-up


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
            env = dict(os.environ, PRIME_TRACES_URL=server.url, LOOP_KIND="eval")
            for round_ in range(repeats):
                order = SDKS[round_ % len(SDKS) :] + SDKS[: round_ % len(SDKS)]
                outs = {}
                rounds_dir = scratch / f"round-{round_}"
                rounds_dir.mkdir()
                for sdk in order:
                    out = run_worker(sdk, episodes, server.url, rounds_dir, steps, env)
                    if sdk in ("online", "vendor"):
                        check_landed(server, out["run_id"], steps * PER_STEP, sdk)
                    outs[sdk] = out
                for sdk, out in outs.items():
                    out["slowdown"] = out["loop_s"] / outs["none"]["loop_s"] - 1.0
                    results[sdk].append(out)
    return [_table(results, steps, repeats)]


def _split(out: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The log times of the loop's first ``EARLY_S`` seconds, and the rest's."""
    early = [s for s, at in zip(out["logs_s"], out["at_s"], strict=True) if at < EARLY_S]
    late = [s for s, at in zip(out["logs_s"], out["at_s"], strict=True) if at >= EARLY_S]
    return early, late


def _table(results: dict[str, list[dict[str, Any]]], steps: int, repeats: int) -> Table:
    def med(sdk: str, of: Any) -> float:
        return float(statistics.median(of(r) for r in results[sdk]))

    def pct(samples: list[float], which: int) -> float:
        return benchlib.pcts(samples)[which] * 1000 if samples else float("nan")

    table = Table(
        f"An evaluation's loop with shipping beside it: {steps} steps of work + "
        f"{PER_STEP} gsm8k episodes, one local platform on loopback",
        [
            "producer",
            "loop slowdown vs none",
            "log p50 ms",
            "log p99 ms",
            f"first {EARLY_S:g} s p50 ms",
            f"first {EARLY_S:g} s p99 ms",
            f"first {EARLY_S:g} s p99 less CPU wait ms",
            "after p99 ms",
            "init→finish s",
            "spread (slowdown)",
        ],
    )
    for sdk in SDKS:
        table.add(
            sdk,
            f"{med(sdk, lambda r: r['slowdown']) * 100:+.0f}%",
            f"{med(sdk, lambda r: pct(r['logs_s'], 0)):.2f}",
            f"{med(sdk, lambda r: pct(r['logs_s'], 1)):.2f}",
            f"{med(sdk, lambda r: pct(_split(r)[0], 0)):.2f}",
            f"{med(sdk, lambda r: pct(_split(r)[0], 1)):.2f}",
            f"{med(sdk, lambda r: pct(_split({**r, 'logs_s': benchlib.own_times(r)})[0], 1)):.2f}",
            f"{med(sdk, lambda r: pct(_split(r)[1], 1)):.2f}",
            f"{med(sdk, lambda r: r['init_to_finish_s']):.2f}",
            benchlib.spread([r["slowdown"] * 100 for r in results[sdk]]),
        )
    online = med("online", lambda r: r["slowdown"]) * 100
    vendor = med("vendor", lambda r: r["slowdown"]) * 100
    early_online = med("online", lambda r: pct(_split(r)[0], 1))
    early_vendor = med("vendor", lambda r: pct(_split(r)[0], 1))
    table.notes += [
        f"online slowdown {online:+.0f}% vs vendor {vendor:+.0f}% (+5 points allowed): "
        f"{benchlib.verdict(online, vendor + 5)}",
        f"online log p99 in the first {EARLY_S:g} s {early_online:.2f} ms vs vendor "
        f"{early_vendor:.2f} ms (+1 ms allowed): "
        f"{benchlib.verdict(early_online, early_vendor + 1)}",
        f"median of {repeats} round(s), each producer a fresh process, in rotating order; "
        "every online run verified on the server (its episodes in Prime Traces)",
        "less CPU wait: of each log time, the part its thread spent runnable and waiting for a "
        "CPU taken out (Linux's schedstat): where it is far below the p99, the host's other "
        "work made the p99, not the SDK",
    ]
    return table


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
