"""Server instructions: the local platform's instructions per metrics row, by
the HTTP layer it is served with.

Why it exists: issue #32 asks ``sync`` for 2,000 metric rows/s, one row a
request, and the platform's one event loop is the bound (tools/bench/RESULTS.md,
"Sync scaling": 1.08 CPU ms/row at 100,000 steps, ≤ 0.50 needed). Its CPU
per row on a shared host moves by a fifth from one run to the next, too much
to tell a cut of a few per cent; its instructions under callgrind do not move.
This counts them for the same rows (four requests in flight through the SDK's
client, the server counted only while they are answered) with the platform's
app and guard served three ways: as ``primeruns serve`` runs it (uvicorn's h11
protocol with serve's bounds: ``slow_clients``, ``one_write``); under
uvicorn's stock h11 protocol (the bounds' own cost is the difference); and
under uvicorn's httptools protocol where httptools is installed (what h11's
pure-Python parsing and state machine cost: serve does not run httptools,
``primeruns/local/cli.py`` says why). The last row is a measure, not an
option: what a bounded protocol on a C parser could save.

Needs valgrind (``callgrind_control`` with it). Run from the repository root::

    python tools/bench/server_instructions.py [--quick]
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import benchlib
from benchlib import API_KEY, SERVING, TEAM, Table, parse_args, print_tables

from primeruns.local.cli import API_KEY_ENV
from primeruns.platform import PlatformClient, Settings

WIDTH = 4  # requests in flight, as a sync's uplink sends them
WARM = 50  # rows answered before counting starts (imports, caches, the first pages)
START_S = 300.0  # a server under callgrind starts ~50 times slower

# The platform's app and guard as serve builds them, under uvicorn's stock
# protocol ``sys.argv[1]`` ("h11" or "httptools"), without serve's bounds.
_STOCK = (
    """
import sys
from pathlib import Path

import uvicorn

from primeruns.local.app import build_app
from primeruns.local.guard import Guard, GuardSettings, allowed_hosts
from primeruns.local.settings import ServerSettings

app = build_app(ServerSettings(data_dir=Path(sys.argv[2])))
guard = Guard(app, GuardSettings(api_key=None, hosts=allowed_hosts("127.0.0.1")))
config = uvicorn.Config(guard, host="127.0.0.1", port=0, http=sys.argv[1], ws="none",
                        log_level="warning", access_log=False, proxy_headers=False,
                        server_header=False, lifespan="on")
"""
    + SERVING
)


def stacks() -> list[tuple[str, list[str]]]:
    """(name, the server's arguments after the interpreter; ``DATA`` its data folder)."""
    served = ["-m", "primeruns.local", "--host", "127.0.0.1", "--port", "0", "--data", "DATA"]
    found = [
        ("serve: uvicorn h11 + serve's bounds", served),
        ("uvicorn h11, no bounds", ["-c", _STOCK, "h11", "DATA"]),
    ]
    if importlib.util.find_spec("httptools") is not None:
        found.append(("uvicorn httptools, no bounds", ["-c", _STOCK, "httptools", "DATA"]))
    return found


def instructions_per_row(args: Sequence[str], rows: int) -> float:
    """The server's instructions per metrics row while ``rows`` are answered."""
    with tempfile.TemporaryDirectory() as tmp:
        out, log_path = Path(tmp) / "callgrind.out", Path(tmp) / "server.log"
        env = dict(os.environ, PYTHONHASHSEED="0")
        env.pop(API_KEY_ENV, None)
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            *[str(Path(tmp) / "data") if a == "DATA" else a for a in args],
        ]
        with open(log_path, "wb") as log:
            # From the temporary folder: ``python -m`` puts the working folder first on the path.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env=env)
        try:
            url = _listening(log_path, proc)
            sdk = PlatformClient(
                Settings(
                    api_key=API_KEY,
                    origin=url,
                    api_prefix="/api/v1",
                    internal=False,
                    team_id=TEAM,
                    traces_url=url,
                    frontend_url=url,
                    traces_opt_out=True,
                )
            )
            run = sdk.api(
                "POST",
                "/rft/external-runs",
                {"base_model": "m", "team_id": TEAM, "max_steps": 1, "name": "instructions"},
            )["run"]["id"]
            bodies = [
                {"run_id": run, "metrics": {**benchlib.metrics_row(i), "step": i}}
                for i in range(WARM + rows)
            ]
            for body in bodies[:WARM]:
                sdk.api("POST", "/rft/metrics", body)
            _instrument(proc.pid, "on")
            with ThreadPoolExecutor(WIDTH) as pool:
                list(pool.map(lambda body: sdk.api("POST", "/rft/metrics", body), bodies[WARM:]))
            _instrument(proc.pid, "off")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(START_S)
        totals = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
        if totals is None:
            raise SystemExit(f"callgrind wrote no totals: {out}")
        return int(totals.group(1)) / rows


def _listening(log_path: Path, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(rb"listening on (http://\S+)", log_path.read_bytes())
        if found:
            return found.group(1).decode()
        time.sleep(0.2)
    raise SystemExit(f"the server did not start: {log_path.read_text(errors='replace')[-2000:]}")


def _instrument(pid: int, state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(pid)], check=True, capture_output=True)


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    del repeat  # (instructions do not vary: one run each)
    rows = 300 if quick else 1000
    t = Table(
        f"Server instructions: {rows:,} metrics rows, {WIDTH} in flight, by HTTP layer",
        ["server", "instructions/row", "÷ serve"],
    )
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        t.notes.append("valgrind is not installed: nothing measured")
        return [t]
    measured = [(name, instructions_per_row(args, rows)) for name, args in stacks()]
    served = measured[0][1]
    for name, per_row in measured:
        t.add(name, f"{per_row:,.0f}", f"{per_row / served:.2f}")
    if len(measured) > 2:
        beyond = (served - measured[2][1]) / served
        t.notes.append(
            f"the HTTP layer beyond httptools' (h11's parsing and state machine, serve's "
            f"bounds): {beyond:.0%} of serve's instructions a row; everything else (asyncio, "
            f"the guard, Starlette, the route, SQLite) is the rest"
        )
    t.notes.append(
        "instructions of the server process (all its threads) while the rows were answered, "
        "counted by callgrind (PYTHONHASHSEED=0); the app, guard, routes and SQLite are the "
        "same in every row, only the HTTP protocol differs"
    )
    return [t]


def main() -> None:
    args = parse_args(__doc__)
    print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
