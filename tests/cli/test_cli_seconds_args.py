"""Seconds given on the command line: a finite number, never NaN or an infinity."""

from __future__ import annotations

import pytest

from primeruns.cli import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["sync", "--watch", "--interval", "nan"],  # synced in a loop that never slept
        ["sync", "--watch", "--interval", "inf"],  # OverflowError out of the wait
        ["replay", "--all", "--timeout", "nan"],
        ["replay", "--all", "--timeout", "-1"],
        ["doctor", "--timeout", "inf"],
    ],
)
def test_a_number_of_seconds_that_is_not_finite_or_is_negative_is_refused_naming_the_flag(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert f"argument {argv[-2]}: {argv[-1]!r} is not a number of seconds" in said, said


def test_a_finite_number_of_seconds_is_taken() -> None:
    args = build_parser().parse_args(["sync", "--watch", "--interval", "0"])
    assert args.interval == 0.0  # passes back to back
    assert build_parser().parse_args(["replay", "--all", "--timeout", "0"]).timeout == 0.0
