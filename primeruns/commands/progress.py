"""The progress bars of ``replay``/``sync``: one per sink that will ship, in records.

Each bar counts what its sink has to ship in the user's units (episodes,
traces, metric rows), with the percentage, the rate and the time left. A sink
that is off (opted out, not enabled for the account) gets no bar, and one that
stops on the way says why (the server's words, made inert, never read as
markup). rich draws them in place on a terminal; on a pipe or a file only the
final state is printed, so logs stay readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as Bars
from rich.text import Text

from ..ship.uplink import Progress
from .console import inert, make_console

__all__ = ["ShipProgress"]


class _Rate(ProgressColumn):
    """Records a second, in the task's own unit."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "records")
        return Text("" if speed is None else f"{speed:,.1f} {unit}/s", style="dim")


class ShipProgress:
    """Called with the uplink's ``Progress``; ``totals`` are the records each
    sink that will ship has to ship, ``units`` what they are."""

    def __init__(self, stream: TextIO, totals: Mapping[str, int], units: Mapping[str, str]) -> None:
        self._bars = Bars(
            TextColumn("  {task.description:<14}", markup=False),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TaskProgressColumn(),
            _Rate(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}", style="yellow", markup=False),
            console=make_console(stream),
            auto_refresh=False,
        )
        self._tasks: dict[str, TaskID] = {
            sink: self._bars.add_task(
                sink, total=max(total, 0), unit=units.get(sink, "records"), note=""
            )
            for sink, total in totals.items()
        }
        self._bars.start()

    def __call__(self, progress: Progress) -> None:
        for sink, task in self._tasks.items():
            total = self._bars.tasks[task].total or 0
            note = progress.stopped.get(sink)
            self._bars.update(
                task,
                completed=min(progress.sent.get(sink, 0), total),
                note=f"stopped: {inert(note)}" if note else "",
            )
        self._bars.refresh()

    def done(self) -> None:
        self._bars.refresh()
        self._bars.stop()
