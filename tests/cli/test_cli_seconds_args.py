"""Seconds given on the command line: a finite number, never NaN or an
infinity; a timeout above 0 (one of 0 leaves no time for anything)."""

from __future__ import annotations

import pytest

from primeruns.cli import build_parser

_SECONDS = "is not a number of seconds; use a finite number of at least 0"
_TIMEOUT = "is not a timeout; use a finite number of seconds above 0"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sync", "--watch", "--interval", "nan"], _SECONDS),  # synced in a loop that never slept
        (["sync", "--watch", "--interval", "inf"], _SECONDS),  # OverflowError out of the wait
        (["replay", "--all", "--timeout", "nan"], _TIMEOUT),
        (["replay", "--all", "--timeout", "-1"], _TIMEOUT),
        (["doctor", "--timeout", "inf"], _TIMEOUT),
        # A timeout of 0: sync and replay registered a run and shipped none
        # of it, doctor found a platform that answers unreachable.
        (["replay", "--all", "--timeout", "0"], _TIMEOUT),
        (["sync", "--all", "--timeout", "0"], _TIMEOUT),
        (["doctor", "--timeout", "0"], _TIMEOUT),
        (["doctor", "--timeout", "-0.0"], _TIMEOUT),
        # Past what a wait takes: OverflowError, a traceback, after a first
        # pass (poll's 2**31 - 1 ms) or out of the connect's socket timeout.
        (["sync", "--watch", "--interval", "1e300"], _SECONDS),
        (["sync", "--watch", "--interval", "3000000"], _SECONDS),
        (["doctor", "--timeout", "1e10"], _TIMEOUT),
        (["replay", "--all", "--timeout", "1e300"], _TIMEOUT),
    ],
)
def test_a_number_of_seconds_that_is_not_finite_or_is_negative_is_refused_naming_the_flag(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[-2]}: {argv[-1]!r} {said}" in err, err


def test_a_finite_number_of_seconds_is_taken() -> None:
    args = build_parser().parse_args(["sync", "--watch", "--interval", "0"])
    assert args.interval == 0.0  # passes back to back
    assert build_parser().parse_args(["replay", "--all", "--timeout", "0.5"]).timeout == 0.5
    assert build_parser().parse_args(["doctor", "--timeout", "1e-3"]).timeout == 0.001
    assert build_parser().parse_args(["sync", "--all", "--timeout", "1e6"]).timeout == 1e6
    assert build_parser().parse_args(["sync", "--watch", "--interval", "604800"]).interval == 604800
