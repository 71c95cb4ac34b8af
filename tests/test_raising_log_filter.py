"""A logging filter of the program's that raises stops no shipping.

Logging guards a handler's ``emit``, not a filter: a ``Filter`` whose
``filter()`` raises raised out of the SDK's own warnings, and a warning in a
background thread's loop (a platform failure, retried) ended the thread, so
nothing more was shipped. Under ``on_error="warn"`` nothing the program does
may stop shipping.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sdk_helpers import API_KEY, point_at, wait_for

import primeruns as pr
from primeruns.journal import EntryKind, Journal, maintenance
from primeruns.settings import UPLINK_ENV


class _Raising(logging.Filter):
    """The program's filter, with a bug: it raises at every record (of the
    SDK's background threads alone, where ``off_main``)."""

    def __init__(self, *, off_main: bool) -> None:
        super().__init__()
        self.off_main = off_main
        self.raised: list[str] = []  # (thread) message

    def filter(self, record: logging.LogRecord) -> bool:
        if self.off_main and record.threadName == "MainThread":
            return True
        self.raised.append(f"({record.threadName}) {record.getMessage()}")
        raise RuntimeError("the program's filter failed")


@pytest.fixture(params=["everywhere", "off_main"])
def raising_filter(request: pytest.FixtureRequest) -> Iterator[_Raising]:
    """The filter on the ``primeruns`` logger and on a handler of it (which
    its children's records reach too), the SDK's info lines wanted."""
    logger = logging.getLogger("primeruns")
    raising = _Raising(off_main=request.param == "off_main")
    handler = logging.StreamHandler(io.StringIO())  # (a NullHandler runs no filter)
    handler.addFilter(raising)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addFilter(raising)
    logger.addHandler(handler)
    try:
        yield raising
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(raising)
        logger.setLevel(level)


def test_a_raising_logging_filter_stops_no_shipping_from_threads(
    make_local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    raising_filter: _Raising,
) -> None:
    lp = make_local_platform()
    runs = point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv(UPLINK_ENV, "threads")
    # The platform fails the run's registration once: init() warns, and the
    # run registers from a background thread, which says so.
    lp.set_faults(retryable_rate=1.0, statuses=[500], routes=["/api/v1/rft/"], max_faults=1)
    ended: list[str] = []  # the SDK's threads ended by an exception
    monkeypatch.setattr(threading, "excepthook", lambda args: ended.append(repr(args.exc_value)))
    run = pr.init(
        kind="train", model="m", team_id="team-a", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    wait_for(lambda: run.url is not None, what="the registration from the background")
    for step in range(20):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    run.finish(timeout=120)
    assert lp.set_faults()["injected"] == 1
    # The filter raised at the SDK's lines, in a background thread too.
    assert any(not said.startswith("(MainThread)") for said in raising_filter.raised)
    assert ended == []
    stored = lp.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 20, "steps": 20}
    assert run.failed_records == {}


def test_a_raising_logging_filter_ends_no_background_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raising_filter: _Raising
) -> None:
    """The journal's background sync logs a step that failed in its guard
    (``Background._guarded``), which then goes on to the next pass; the
    warning itself raised out of the guard and ended the thread: no sync, no
    reserve, no ``owner.lock`` made again for the rest of the run."""
    with Journal.create(tmp_path, local_id="run") as j:
        background = j._background
        assert background is not None

        def fails(path: Path) -> None:
            raise OSError("the reserve file could not be made")

        monkeypatch.setattr(maintenance, "ensure_reserve", fails)
        for n in (1, 2):  # a pass after each write
            j.append(EntryKind.METRICS, [b'{"n":%d}' % n])
            wait_for(
                lambda n=n: (
                    background.failures["restore the reserve file"] >= n
                    or not background._thread.is_alive()
                ),
                what=f"pass {n}'s failed step",
            )
            assert background._thread.is_alive()
    assert raising_filter.raised  # at the warning of the first
