"""What finish() says when it returns before the run is closed out: who is
still shipping it, and what the user does if that stops."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from primeruns import closing


def _said(caplog: pytest.LogCaptureFixture, uplink: Any) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        recorder = SimpleNamespace(uplink_errors=list)
        closing._report(None, SimpleNamespace(uplink=uplink), "run-1", "/runs/j", recorder)  # type: ignore[arg-type]
    return caplog.text


def test_a_run_still_shipping_names_its_uplink_process_or_this_processs_threads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said = _said(caplog, SimpleNamespace(pid=4321))
    assert "by its uplink (pid 4321)" in said and "primeruns replay /runs/j" in said
    # Found by an adversarial review: an uplink in threads was "pid None".
    said = _said(caplog, SimpleNamespace())
    assert "pid None" not in said
    assert "by threads of this process" in said and "primeruns replay /runs/j" in said
