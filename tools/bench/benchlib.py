"""What every benchmark under ``tools/bench/`` shares: the workloads, an isolated
environment pointed at a local platform, percentiles, and the result tables.

Why one module: each benchmark reports figures as ratios to a reference measured
in the same run (the machines here are shared and noisy), and they all print the
same kind of table so ``run_all.py`` can merge them into ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import io
import json
import os
import platform as pyplatform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

ROOT = Path(__file__).resolve().parents[2]
# The checkout whose package this process measures: this one, or the tree a
# measuring child was given (``childrun.child_json``). Its package comes
# first, or a child of a ``--before`` tree that imports this module would
# import this checkout's package and measure it twice.
PACKAGE_TREE = Path(os.environ.get("PRIMERUNS_BENCH_TREE") or ROOT)
if sys.path[:1] != [str(PACKAGE_TREE)]:
    sys.path.insert(0, str(PACKAGE_TREE))


def as_installed(tree: Path) -> Path:
    """``tree``, its package's bytecode compiled as ``pip install`` compiles an
    installed package's.

    A checkout run in place has none until an import writes it, and where
    ``PYTHONDONTWRITEBYTECODE`` is set (as on the machines these benchmarks
    run on) no import ever does: every fresh process then compiled each
    module it imported from source (~50 ms of the first ``init()``), while
    the vendor's SDK, installed by pip into its own environment, loads
    compiled bytecode. A user's SDK is installed, so both are measured so."""
    compileall.compile_dir(tree / "primeruns", quiet=2)
    return tree


as_installed(PACKAGE_TREE)

from primeruns.local import LocalPlatform  # noqa: E402

DATA_DIR = ROOT / ".." / "shared" / "data"
API_KEY = "bench-key-0123456789"
TEAM = "team-bench"
# Variables that would point a benchmark's SDK somewhere other than the local platform.
_PRIME_VARS = (
    "PRIME_API_KEY",
    "PRIME_API_BASE_URL",
    "PRIME_BASE_URL",
    "PRIME_TEAM_ID",
    "PRIME_TRACES_URL",
    "PRIME_TRACES_OPT_OUT",
    "PRIME_RUNS_MODE",
    "PRIME_RUNS_DIR",
    "PRIME_FRONTEND_URL",
)


# -- workloads ---------------------------------------------------------------------
def raw_lines(name: str) -> list[bytes]:
    """The workload's JSONL lines (``gsm8k-eval`` or ``agentic-train``), as stored."""
    path = DATA_DIR / f"{name}.jsonl.zst"
    if not path.exists():
        raise SystemExit(f"workload {path.name} not found under {DATA_DIR.resolve()}")
    with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        return [line for line in io.BufferedReader(reader).read().splitlines() if line.strip()]


def records(name: str, n: int | None = None) -> list[dict[str, Any]]:
    """Fresh (mutable) copies of the workload's first ``n`` records."""
    return [json.loads(line) for line in raw_lines(name)[:n]]


def renew_ids(episode: dict[str, Any], tag: str) -> dict[str, Any]:
    """Give ``episode`` (in place) and its traces fresh ids derived from ``tag``:
    the same content as a new episode, which the traces service must store anew
    (ids repeating within one upload are rejected, across uploads deduplicated)."""
    episode["id"] = tag
    for j, trace in enumerate(episode.get("traces") or []):
        if isinstance(trace, dict):
            trace["id"] = f"{tag}-t{j}"
    return episode


def metrics_row(i: int) -> dict[str, float]:
    """A 10-scalar training metrics row, different every step."""
    base = float(i)
    names = ("loss", "reward", "kl", "entropy", "lr", "grad_norm", "tokens", "acc", "len", "clip")
    return {k: base * 0.001 + j * 0.37 for j, k in enumerate(names)}


# -- environment ---------------------------------------------------------------------
@contextlib.contextmanager
def isolated_env(url: str | None) -> Iterator[Path]:
    """Within: HOME is a fresh temp dir, no PRIME_* settings leak in from the
    machine, and Prime Traces points at ``url``. Yields a scratch directory."""
    saved = {k: os.environ.get(k) for k in (*_PRIME_VARS, "HOME", "PRIME_RUNS_RETRY_BASE_S")}
    with tempfile.TemporaryDirectory(prefix="primeruns-bench-") as tmp:
        scratch = Path(tmp)
        (scratch / "home").mkdir()
        try:
            for k in _PRIME_VARS:
                os.environ.pop(k, None)
            os.environ["HOME"] = str(scratch / "home")
            if url is not None:
                os.environ["PRIME_TRACES_URL"] = url
            yield scratch
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


#: The end of a server script run by ``python -c`` that made a
#: ``uvicorn.Config`` named ``config``: it serves, and prints its origin
#: ("listening on http://...") once it listens on its port.
SERVING = """
server = uvicorn.Server(config)
_startup = server.startup

async def startup(sockets=None):
    await _startup(sockets)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)

server.startup = startup
server.run()
"""


@contextlib.contextmanager
def local_platform(data_dir: Path, tree: Path | None = None) -> Iterator[LocalPlatform]:
    """A started local platform (any key, every team) on loopback; the code of
    checkout ``tree`` (its package first on the server's path) when given."""
    server = LocalPlatform(data_dir)
    if tree is None:
        server.start()
    else:
        # The server takes our environment and working directory as it starts,
        # and ``python -m`` puts that directory first on its path (a checkout's
        # root would win over PYTHONPATH): both are the tree's while it starts.
        saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
        os.environ["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [saved])])
        os.chdir(tree)
        try:
            server.start()
        finally:
            os.chdir(cwd)
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
    try:
        yield server
    finally:
        server.stop()


# -- statistics ----------------------------------------------------------------------
def pcts(samples: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) of ``samples``."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99


def own_times(out: dict[str, Any]) -> list[float]:
    """A loop worker's log times less the part of each its thread spent
    runnable and waiting for a CPU (``loop_worker``'s ``waits_s``; zeros
    where the platform does not say): on a loaded host the slowest calls
    are nearly all that wait, whichever SDK made them."""
    waits = out.get("waits_s") or [0.0] * len(out["logs_s"])
    return [max(0.0, s - w) for s, w in zip(out["logs_s"], waits, strict=True)]


def spread(values: Sequence[float]) -> str:
    """How noisy repeated measurements were: ``min–max`` relative to the median."""
    if len(values) < 2:
        return "n=1"
    mid = statistics.median(values)
    if mid == 0:
        return "-"
    return f"±{max(abs(max(values) - mid), abs(mid - min(values))) / mid * 100:.0f}%"


def rss_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB, from /proc/self/status."""
    now = peak = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                now = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    return now, peak


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# -- tables ----------------------------------------------------------------------------
@dataclass
class Table:
    """One result table: every figure a ratio with the absolute numbers beside it."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
        line = "  ".join(h.ljust(w) for h, w in zip(self.headers, widths, strict=True))
        out = [self.title, line, "-" * len(line)]
        for row in self.rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        out += [f"  {n}" for n in self.notes]
        return "\n".join(out)

    def markdown(self) -> str:
        out = [f"### {self.title}", "", "| " + " | ".join(self.headers) + " |"]
        out.append("|" + "|".join("---" for _ in self.headers) + "|")
        out += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            out.append("")
            out += [f"- {n}" for n in self.notes]
        return "\n".join(out)


def verdict(value: float, limit: float, *, at_least: bool = False) -> str:
    ok = value >= limit if at_least else value <= limit
    return f"{'ok' if ok else 'MISS'} ({'≥' if at_least else '≤'} {limit:g})"


# A child that keeps one core busy for ``argv[1]`` seconds of wall time and
# prints the CPU seconds it got meanwhile.
# Its CPU from the spin's start: the interpreter's start-up before it (some
# 40 ms on a slow host) counted too made two 0.2 s spins 2.47 cores' worth.
_SPIN = """
import sys, time
start = time.process_time()
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    sum(range(1000))
print(time.process_time() - start)
"""


def parallel_cores(seconds: float = 1.0) -> float:
    """The cores' worth of CPU this machine gives as many busy processes as it
    has CPUs, run at once for ``seconds``: their CPU seconds over the wall
    seconds. ``nproc`` is what the guest is told; a virtual machine whose
    CPUs share one host core gives two busy processes about one core's worth
    between them, and a sync and its platform are two busy processes."""
    count = os.cpu_count() or 1
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _SPIN, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    used = 0.0
    for child in children:
        out, _ = child.communicate(timeout=60 + seconds * 10)
        used += float(out.strip().splitlines()[-1])
    return used / seconds


def ceiling_note(cores: float, sync_ms: float, platform_ms: float, target_rows_s: float) -> str:
    """What CPU per row allows here, with the verdict for ``target_rows_s``.

    A sync and its platform busy at once get ``cores`` cores' worth
    (``parallel_cores``), so no sync goes faster than ``cores`` × 1000 ÷ their
    CPU per row together; and each is one interpreter (the sync's threads
    share one lock, the platform is one event loop), so neither goes much past
    one core: 1000 ÷ its own CPU per row (about: work outside the interpreter,
    compression, the journal, the kernel, runs beside it). The lowest binds."""
    bounds = {
        f"{cores:.2f} cores' worth for both": cores * 1000.0 / (sync_ms + platform_ms),
        "the sync's interpreter, one core": 1000.0 / sync_ms,
        "the platform's event loop, one core": 1000.0 / platform_ms,
    }
    binding = min(bounds, key=lambda name: bounds[name])
    together = cores * 1000.0 / target_rows_s
    each = 1000.0 / target_rows_s
    ok = sync_ms + platform_ms <= together and max(sync_ms, platform_ms) <= each
    return (
        f"sync {sync_ms:.2f} + platform {platform_ms:.2f} CPU ms/row: about "
        f"{bounds[binding]:,.0f} rows/s at most here (bound by {binding}); "
        f"{target_rows_s:,.0f} rows/s needs ≤ {together:.2f} ms/row together and ≤ "
        f"{each:.2f} each ({'ok' if ok else 'MISS'})"
    )


def machine() -> str:
    """``nproc``, the CPU model and the Python version: where the tables were measured."""
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} CPUs ({model}), Python {pyplatform.python_version()}, "
        f"{pyplatform.system()} {pyplatform.release()}"
    )


def parse_args(
    doc: str | None, argv: Sequence[str] | None = None, *, before: bool = False
) -> argparse.Namespace:
    """``--quick`` and ``--repeat``; with ``before``, ``--before TREE`` too (a
    checkout whose package runs beside this one's, for a before/after)."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a short, CI-sized version")
    parser.add_argument(
        "--repeat", type=int, default=None, help="repetitions (medians are reported)"
    )
    if before:
        parser.add_argument(
            "--before",
            type=as_installed_arg,
            default=None,
            help="a checkout to measure beside this one",
        )
    return parser.parse_args(argv)


def as_installed_arg(value: str) -> Path:
    """A ``--before`` checkout, resolved and its bytecode compiled (``as_installed``)."""
    return as_installed(Path(value).resolve())


def print_tables(tables: Sequence[Table]) -> None:
    print(f"machine: {machine()}")
    for table in tables:
        print()
        print(table.text())
