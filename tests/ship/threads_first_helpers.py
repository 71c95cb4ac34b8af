"""What the tests of an evaluation's threads-first uplink (``ship.startup``) share."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sdk_helpers import API_KEY

import primeruns as pr
from primeruns.ship.factory import sink_kinds
from primeruns.ship.startup import ThreadsFirst

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import landed_once


def eval_run(url: str, runs: Path) -> pr.Run:
    return pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=url, runs_dir=runs)


def threads_first(run: pr.Run) -> ThreadsFirst:
    """The run's uplink handle, which must be the threads-first one."""
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    assert isinstance(uplink, ThreadsFirst)
    return uplink


def stored_once(stored: dict[str, Any], n: int, status: str = "COMPLETED") -> bool:
    """The platform's run has ``status`` and each of its ``n`` episodes once,
    in Prime Traces and in the sample table."""
    samples = stored["samples"]
    return bool(
        stored["status"] == status
        and landed_once(stored, n)
        and samples["rows"] == samples["distinct"] == n
    )


def in_flight(run: pr.Run) -> bool:
    """Whether a sink of the run has a batch recorded in flight."""
    journal = run._recorder.journal
    assert journal is not None
    return any(journal.cursor(n).inflight is not None for n in sink_kinds("eval"))
