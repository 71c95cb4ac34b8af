"""``primeruns show`` of a long run reads what it prints, not the whole journal:
the entries it decodes are bounded by its curves' rows, whatever the run's
length, while it still names a damaged entry anywhere in the run and
``--full`` still decodes every entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli, flip_entry_bytes
from sdk_helpers import point_at

import primeruns as pr
from primeruns.commands import show
from primeruns.journal import layout, reading

STEPS = 300
CURVE_ROWS = 40  # what show reads of the metric rows here (2,000 by default)


def _long_training_run(runs: Path) -> Path:
    """An offline training run: a metrics row and a summary update every step."""
    run = pr.init(
        kind="train",
        model="m",
        team_id="team-test",
        mode="offline",
        training=pr.TrainingSpec(max_steps=STEPS),
        runs_dir=runs,
    )
    for step in range(STEPS):
        run.log_metrics({"loss": 1.0 / (step + 1), "reward": step * 0.01}, step=step)
        run.update_summary({"best": step, "note": f"step {step} of a long run, said at length"})
    run.finish(summary={"avg_reward": 0.5})
    assert run.journal_path is not None
    return run.journal_path


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each entry decoded (decompressed) from now on, by seq."""
    seen: list[int] = []
    real = layout.decode_frame

    def counting(value: bytes, dicts: Any = None, seq: int | None = None, **kw: Any) -> Any:
        if seq is not None:
            seen.append(seq)
        return real(value, dicts, seq, **kw)

    # A range read decodes its batch in one pass (``decoding.decode_entries``),
    # and only the entries it cannot take one at a time through decode_frame.
    batch = reading.decode_entries

    def counting_batch(raw: Any, *args: Any, **kw: Any) -> Any:
        values = list(raw)
        seen.extend(seq for seq, _ in values)
        return batch(values, *args, **kw)

    monkeypatch.setattr(layout, "decode_frame", counting)
    monkeypatch.setattr(reading, "decode_entries", counting_batch)
    monkeypatch.setattr(show, "CURVE_ROWS", CURVE_ROWS)
    return seen


def test_show_decodes_a_bounded_number_of_entries_of_a_long_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    decodes: list[int],
) -> None:
    journal = _long_training_run(point_at(monkeypatch, tmp_path, None))
    decodes.clear()
    code, out, _ = cli(capsys, "show", str(journal), "--json")
    doc = json.loads(out)
    assert code == 0
    # What it prints is all there: counts, the final summary, the curves' ends.
    assert doc["metric_rows"] == {"total": STEPS, "read": CURVE_ROWS}
    assert doc["summary"]["best"] == STEPS - 1 and doc["summary"]["avg_reward"] == 0.5
    assert doc["metrics"]["loss"]["steps"] == [0, STEPS - 1]
    assert doc["metrics"]["reward"]["last"] == pytest.approx((STEPS - 1) * 0.01)
    # ... from the curves' rows and a handful more (the run's opening, its
    # finish), not the 2 x STEPS entries the run holds.
    assert len(decodes) <= CURVE_ROWS + 10, len(decodes)

    decodes.clear()
    code, out, _ = cli(capsys, "show", str(journal), "--full", "--json")
    assert code == 0 and json.loads(out)["metric_rows"]["read"] == STEPS
    assert len(decodes) >= 2 * STEPS  # every entry, checked by decoding it


def test_show_still_finds_damage_in_an_entry_it_does_not_decode(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    decodes: list[int],
) -> None:
    journal = _long_training_run(point_at(monkeypatch, tmp_path, None))
    flip_entry_bytes(journal, 101)  # a summary update mid-run: never shown
    decodes.clear()
    code, out, _ = cli(capsys, "show", str(journal))
    assert code == 4 and "entry 101" in out, out
    assert 101 not in decodes


@pytest.mark.parametrize("width", [12, 60])
def test_show_draws_sparklines_as_wide_as_width_asks(
    width: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--width`` was ignored: the sparklines came out as wide as the longest
    metric name (#31's row on `show`)."""
    point_at(monkeypatch, tmp_path, None)
    journal = _long_training_run(tmp_path / "runs")
    code, out, _ = cli(capsys, "show", "--runs-dir", str(tmp_path / "runs"), journal.name,
                       "--width", str(width))  # fmt: skip
    assert code == 0
    blocks = "▁▂▃▄▅▆▇█"
    lines = [line for line in out.splitlines() if line.strip().startswith("loss ")]
    assert len(lines) == 1
    drawn = lines[0].split("  min ")[0].strip()[len("loss") :].strip()
    assert len(drawn) == width and set(drawn) <= set(blocks + " ")
