"""End to end: init → log N gsm8k episodes → finish, against a local platform.

Run ``python tools/bench/end_to_end.py`` (``--quick`` for 300 episodes instead
of 5,000) from the repository root. Three producers, each its own process (so
each pays its own start-up and is measured alike), take turns, each run
against a ``primeruns serve`` of its own on loopback, started empty, logging
the same episodes one ``log_episodes([episode])`` call each:

- ``ours``: this SDK as shipped (journal, the uplink process, sinks);
- ``ours, threads``: this SDK shipping from threads in the producer (the
  fallback where no process can be started, ``PRIME_RUNS_UPLINK=threads``),
  with the CPU time its journal spends timed (``journal_cpu.py``);
- ``vendor``: ``prime-runs==0.1.4`` from PyPI, installed by this script in its
  own virtual environment (``tools/bench/.venv-vendor``, git-ignored) because
  it owns the ``prime_runs`` import name. It reads PRIME_TRACES_URL like ours.

Reported per producer: episodes/s (N over wall seconds from just before
``init`` to ``finish`` returning); CPU seconds per episode of the producer
process (every thread, ``time.process_time``), of the producer and its uplink
process together (the uplink's start-up included: a run pays for it), and of
the local platform's server; medians over ``--repeat`` rounds. The 2,000
gsm8k episodes are logged again with new ids (``benchlib.renew_ids``) past
the 2,000th.
Every run is checked on the server (``/_local/runs/{id}``): all N episodes must
have landed in Prime Traces, or the benchmark fails. Ours also writes the eval
sample table (one row per episode); the vendor only does so when Prime Traces
refuses the account, so ours does strictly more work here.

The journal's own cost is the ``ours, threads`` producer's CPU time over the
same CPU time less what the journal spent: ``cpu_s / (cpu_s - journal_cpu_s)``,
the SDK as shipped against the same SDK, in the same run, with the journal's
work taken out. ``journal_cpu_s`` is the thread CPU time (``time.thread_time``)
spent inside the real journal: every ``Journal`` method any thread calls
(append, read, cursor, set_inflight, ack, meta, tally, sync, create, open,
close and its drain; a nested call counted once), the journal functions the
SDK calls (``list_journals``, ...), and the whole of the threads the journal
starts (the mover, which compresses the spool into LMDB, and the background
sync). Shipping from threads keeps all of that in the one measured process.
This replaced a second producer whose journal was a hand-written in-memory
copy of the journal's API (``Journal`` swapped for it), weighed by wall time:
a copy that had to follow the API by hand, broke the benchmark when it fell
behind (033700b mended one such break), and was flagged as a duplicate of
the journal. Two things differ. Taking the journal out entirely is slightly
stricter than an in-memory queue (a queue costs something too). And the
figure is CPU time, not wall time: the wall time of the SDK without its
journal cannot be had by subtraction, since the journal's threads (the
mover's compression, with the GIL let go) run beside the SDK's on another
core. A note gives the wall time over the wall time less the producer
thread's wall time inside the journal: a lower bound of the journal's cost in
wall time, not a budget figure (the GIL the journal's threads hold, delaying
the SDK's, is outside every span; see ``journal_cpu.py``).

``--before TREE`` adds a fourth producer, ``before``: this SDK as shipped
from another checkout (its package first on the worker's path), in the same
rotation, against a local platform of that checkout's code (its package first
on the server's path too), for a before/after of the whole checkout measured
in one run (the table's ``ours ÷ this`` is then after ÷ before; the server
CPU note, the platform's before and after).

Budgets (DESIGN §7, issue #32): ours ≥ 1× the vendor's episodes/s, although
every episode goes to two sinks here; CPU per episode, producer + uplink, ≤ 1.5×
the vendor's; the journal's own cost ≤ 1.3× the same SDK without it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchlib
import journal_cpu
import orjson
from benchlib import Table

HERE = Path(__file__).resolve().parent
VENDOR_VENV = HERE / ".venv-vendor"
VENDOR_PACKAGES = ("prime-runs==0.1.4", "prime-traces==0.0.10", "pyarrow")
WORKER = HERE / "e2e_worker.py"
SDKS = ("ours", "ours, threads", "vendor")
BEFORE = "before"
JOURNAL_TIMED = "ours, threads"


@dataclass(frozen=True)
class Result:
    sdk: str
    episodes: int
    wall_s: float
    cpu_s: float
    log_s: float
    finish_s: float
    child_cpu_s: float  # the producer's reaped children: our uplink process
    server_cpu_s: float  # the local platform's server, while this producer ran
    journal: dict[str, Any] | None = None  # journal_cpu's report, for the timed producer

    @property
    def eps(self) -> float:
        return self.episodes / self.wall_s

    @property
    def journal_cpu_s(self) -> float:
        """The CPU seconds spent in the journal (the timed producer only)."""
        assert self.journal is not None
        seconds: float = self.journal["journal_cpu_s"]
        return seconds

    @property
    def journal_cost(self) -> float:
        """CPU time over CPU time without the journal's (the timed producer only)."""
        return self.cpu_s / (self.cpu_s - self.journal_cpu_s)


def vendor_python() -> Path:
    """The vendor venv's interpreter, creating the venv on first use."""
    python = VENDOR_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENDOR_VENV} with {' '.join(VENDOR_PACKAGES)} ...", file=sys.stderr)
        venv.create(VENDOR_VENV, with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *VENDOR_PACKAGES], check=True)
    return python


def run_worker(
    sdk: str, records_path: Path, url: str, scratch: Path, env: dict[str, str]
) -> dict[str, Any]:
    python = str(vendor_python()) if sdk == "vendor" else sys.executable
    arg = {"ours, threads": "threads", BEFORE: "ours"}.get(sdk, sdk)
    runs_dir = scratch / "runs" / (sdk if sdk == BEFORE else arg)
    proc = subprocess.run(
        [python, str(WORKER), arg, str(records_path), url, str(runs_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{sdk} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if sdk == JOURNAL_TIMED:
        check_timed(result)
    return result


def check_timed(result: dict[str, Any]) -> None:
    """The journal's clock saw all of it: its threads, and no journal function
    bound where it was not wrapped."""
    if result["unwrapped"]:
        raise RuntimeError(f"journal functions not timed: {', '.join(result['unwrapped'])}")
    if not result["journal_threads"]:
        raise RuntimeError("the journal's threads (mover, background sync) were not timed")


def episode_lines(n: int) -> list[bytes]:
    """``n`` gsm8k episodes: the workload's, then the same again with new ids."""
    base = benchlib.raw_lines("gsm8k-eval")
    lines = base[:n]
    for i in range(len(lines), n):
        episode = benchlib.renew_ids(orjson.loads(base[i % len(base)]), f"e2e-{i:06d}")
        lines.append(orjson.dumps(episode))
    return lines


def check_landed(server: Any, run_id: str, n: int, sdk: str) -> dict[str, Any]:
    stored: dict[str, Any] = server.run(run_id)
    traces = stored.get("traces") or {}
    if traces.get("distinct_episodes") != n:
        raise RuntimeError(f"{sdk}: {traces.get('distinct_episodes')} of {n} episodes landed")
    return stored


def run(quick: bool, repeat: int | None = None, before: Path | None = None) -> list[Table]:
    n = 300 if quick else 5000
    repeats = repeat or (1 if quick else 3)
    vendor_python()
    lines = episode_lines(n)
    sdks = SDKS if before is None else (*SDKS, BEFORE)
    results: dict[str, list[Result]] = {sdk: [] for sdk in sdks}
    samples: dict[str, int] = {}
    with benchlib.isolated_env(None) as scratch:
        records_path = scratch / "episodes.jsonl"
        records_path.write_bytes(b"\n".join(lines) + b"\n")
        for round_ in range(repeats):
            # Rotate the order so no producer always runs first (warm caches, drift).
            order = sdks[round_ % len(sdks) :] + sdks[: round_ % len(sdks)]
            for sdk in order:
                # Each run meets a platform of its own, started empty: on one
                # that earlier runs had filled (hundreds of MB of samples in
                # its SQLite file) the same requests cost the platform up to
                # twice the CPU, mostly kernel time in fresh pages, and
                # whichever producer ran last paid for the others.
                data = scratch / f"platform-{round_}-{sdks.index(sdk)}"
                tree = before if sdk == BEFORE else None
                with benchlib.local_platform(data, tree) as server:
                    env = dict(os.environ, PRIME_TRACES_URL=server.url)
                    if sdk == BEFORE and before is not None:
                        env["PYTHONPATH"] = os.pathsep.join(
                            [str(before), *filter(None, [os.environ.get("PYTHONPATH")])]
                        )
                    served = benchlib.cpu_s(server.pid)
                    out = run_worker(sdk, records_path, server.url, scratch, env)
                    server_cpu = benchlib.cpu_s(server.pid) - served
                    stored = check_landed(server, out["run_id"], n, sdk)
                shutil.rmtree(data, ignore_errors=True)
                samples[sdk] = int((stored.get("samples") or {}).get("rows") or 0)
                journal = out if sdk == JOURNAL_TIMED else None
                results[sdk].append(
                    Result(
                        sdk,
                        n,
                        out["wall_s"],
                        out["cpu_s"],
                        out["log_s"],
                        out["finish_s"],
                        out["child_cpu_s"],
                        server_cpu,
                        journal,
                    )
                )
    return [_table(results, samples, n, repeats)]


def _table(
    results: dict[str, list[Result]], samples: dict[str, int], n: int, repeats: int
) -> Table:
    med = {
        sdk: {
            "eps": statistics.median(r.eps for r in rs),
            "cpu": statistics.median(r.cpu_s / r.episodes for r in rs),
            "both": statistics.median((r.cpu_s + r.child_cpu_s) / r.episodes for r in rs),
            "server": statistics.median(r.server_cpu_s / r.episodes for r in rs),
            "wall": statistics.median(r.wall_s for r in rs),
            "log": statistics.median(r.log_s for r in rs),
            "finish": statistics.median(r.finish_s for r in rs),
        }
        for sdk, rs in results.items()
    }
    ours = med["ours"]
    table = Table(
        f"End to end: init → {n} gsm8k episodes → finish, one local platform on loopback",
        [
            "producer",
            "episodes/s",
            "ours ÷ this (episodes/s)",
            "CPU ms/episode",
            "this ÷ ours (CPU)",
            "+ uplink CPU ms/episode",
            "server CPU ms/episode",
            "wall s",
            "log s",
            "finish s",
            "sample rows",
            "spread (episodes/s)",
        ],
    )
    for sdk in results:
        m = med[sdk]
        table.add(
            sdk,
            f"{m['eps']:.0f}",
            f"{ours['eps'] / m['eps']:.2f}",
            f"{m['cpu'] * 1000:.2f}",
            f"{m['cpu'] / ours['cpu']:.2f}",
            f"{m['both'] * 1000:.2f}",
            f"{m['server'] * 1000:.2f}",
            f"{m['wall']:.2f}",
            f"{m['log']:.2f}",
            f"{m['finish']:.2f}",
            str(samples.get(sdk, 0)),
            benchlib.spread([r.eps for r in results[sdk]]),
        )
    vs_vendor = ours["eps"] / med["vendor"]["eps"]
    cpu_vs_vendor = ours["both"] / med["vendor"]["both"]
    table.notes += [
        f"ours ÷ vendor episodes/s = {vs_vendor:.2f}: "
        f"{benchlib.verdict(vs_vendor, 1.0, at_least=True)}",
        f"ours ÷ vendor CPU per episode, producer + uplink = {cpu_vs_vendor:.2f}: "
        f"{benchlib.verdict(cpu_vs_vendor, 1.5)}",
        *_before_notes(results),
        *_journal_notes(results[JOURNAL_TIMED]),
        f"median of {repeats} round(s), producers in rotating order, each run against a "
        "platform of its own, started empty; every run verified on the server (all episodes "
        "in Prime Traces)",
        "CPU = the producer process (all its threads); + uplink: with its reaped children (our "
        "uplink process, start-up included; the vendor has none); server: the local platform's "
        "process while the producer ran",
    ]
    return table


def _before_notes(results: dict[str, list[Result]]) -> list[str]:
    """With ``--before``: the checkout before against this one and the vendor,
    round by round (each round ran all producers back to back)."""
    if BEFORE not in results:
        return []
    rounds = list(zip(results["ours"], results[BEFORE], results["vendor"], strict=True))

    def median(of: Any) -> float:
        return float(statistics.median(of(ours, before, vendor) for ours, before, vendor in rounds))

    def both(r: Result) -> float:
        return r.cpu_s + r.child_cpu_s

    per_round = ", ".join(f"{ours.eps / before.eps:.2f}" for ours, before, _ in rounds)
    before_vendor = median(lambda o, b, v: b.eps / v.eps)
    ours_vendor = median(lambda o, b, v: o.eps / v.eps)
    cpu = median(lambda o, b, v: both(o) / both(b))
    server = median(lambda o, b, v: o.server_cpu_s / b.server_cpu_s)
    return [
        f"before ÷ vendor episodes/s = {before_vendor:.2f}, ours ÷ vendor {ours_vendor:.2f} "
        "(medians of the rounds' ratios)",
        f"ours ÷ before episodes/s by round: {per_round}; CPU per episode, producer + uplink, "
        f"ours ÷ before = {cpu:.2f}; server CPU ours ÷ before = {server:.2f}",
    ]


def _journal_notes(timed: list[Result]) -> list[str]:
    """The journal's own cost, from the producer that timed its journal."""
    reports = [(r, r.journal) for r in timed if r.journal is not None]

    def median(of: Any) -> float:
        return float(statistics.median(of(r, j) for r, j in reports))

    cost = median(lambda r, j: r.journal_cost)
    groups = sorted({g for _, j in reports for g in j["journal_cpu_by"]})
    split = ", ".join(
        f"{g} {median(lambda r, j, g=g: j['journal_cpu_by'].get(g, 0.0)) * 1000:.0f} ms"
        for g in groups
    )
    # The producer thread's wall time inside the journal: what it held the caller.
    wall_cost = median(
        lambda r, j: r.wall_s / (r.wall_s - j["journal_wall_by"].get(journal_cpu.PRODUCER, 0.0))
    )
    return [
        f"journal cost = {JOURNAL_TIMED} CPU ÷ (its CPU - the journal's CPU) = {cost:.2f}: "
        f"{benchlib.verdict(cost, 1.3)} (the same SDK with the journal's work taken out)",
        f"the journal's CPU, timed inside the real journal in {JOURNAL_TIMED} "
        f"(tools/bench/journal_cpu.py): "
        f"{median(lambda r, j: r.journal_cpu_s / r.episodes) * 1000:.2f} ms/episode; {split}; "
        f"{median(lambda r, j: j['journal_calls']):.0f} timed calls, whose timing costs "
        f"~{median(lambda r, j: j['journal_calls'] * j['wrapper_cost_s']) * 1000:.1f} ms "
        f"of {median(lambda r, j: r.cpu_s) * 1000:.0f} ms CPU",
        f"wall time ÷ (wall time - the producer thread's wall time inside the journal) = "
        f"{wall_cost:.2f}: not a budget figure, a lower bound of the journal's cost in wall "
        "time (the GIL its threads hold and the shippers' journal calls are not in it)",
    ]


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv, before=True)
    benchlib.print_tables(run(args.quick, args.repeat, args.before))


if __name__ == "__main__":
    main()
