"""The progress bars of ``replay``/``sync``: one per sink that will ship, in records.

Each bar counts what its sink has to ship in the user's units (episodes,
traces, metric rows), with the percentage, the rate and the time left. A sink
that is off (opted out, not enabled for the account) gets no bar, and one that
stops on the way says why (the server's words, made inert, never read as
markup). rich draws them in place on a terminal; on a pipe or a file only the
final state is printed, so logs stay readable.

Nothing is drawn until shipping begins: a journal refused (its owner lives)
is refused before any bar, with the reason. A sink with nothing to ship says
so instead of a ``0/0 0%`` bar. When the shipment ends, a sink with nothing
left pending is drawn complete: ``train_samples`` counts every episode but
ships only those of every 10th step (the others are skipped, not lost).
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
    sink that will ship has to ship, ``units`` what they are, ``head`` the
    line said before the bars (what is shipped where)."""

    def __init__(
        self,
        stream: TextIO,
        totals: Mapping[str, int],
        units: Mapping[str, str],
        head: Text | None = None,
    ) -> None:
        self._console = make_console(stream)
        self._totals = dict(totals)
        self._units = dict(units)
        self._head = head
        self._stopped: dict[str, str] = {}
        self._bars = Bars(
            TextColumn("  {task.description:<14}", markup=False),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TaskProgressColumn(),
            _Rate(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}", style="yellow", markup=False),
            console=self._console,
            auto_refresh=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._started = self._closed = False

    def _start(self) -> None:
        """The head, a line per sink with nothing to ship, then the bars."""
        if self._started:
            return
        self._started = True
        if self._head is not None:
            self._console.print(self._head)
        for sink, total in self._totals.items():
            if total <= 0:
                self._console.print(Text(f"  {sink:<14} nothing to ship", style="dim"))
                continue
            unit = self._units.get(sink, "records")
            self._tasks[sink] = self._bars.add_task(sink, total=total, unit=unit, note="")
        if self._tasks:  # no bars, no empty line where they would be
            self._bars.start()

    def __call__(self, progress: Progress) -> None:
        self._start()
        self._stopped = dict(progress.stopped)
        for sink, task in self._tasks.items():
            total = self._bars.tasks[task].total or 0
            note = progress.stopped.get(sink)
            self._bars.update(
                task,
                completed=min(progress.sent.get(sink, 0), total),
                note=f"stopped: {inert(note)}" if note else "",
            )
        self._bars.refresh()

    def finish(self, pending: Mapping[str, int]) -> None:
        """The shipment ended with ``pending`` records left per sink: every
        sink that shipped all it had (none left, not stopped) is complete."""
        self._start()
        for sink, task in self._tasks.items():
            if not pending.get(sink) and sink not in self._stopped:
                self._bars.update(task, completed=self._bars.tasks[task].total or 0)
        self.done()

    def done(self) -> None:
        """Stop drawing (nothing at all if shipping never began); once, and
        the terminal is given back whatever interrupts it."""
        if self._started and self._tasks and not self._closed:
            self._closed = True
            try:
                self._bars.refresh()
            finally:
                # Stopped even when a Ctrl-C lands in the last draw: rich hid
                # the cursor and holds stdout and stderr until it stops.
                self._stop()

    def _stop(self) -> None:
        try:
            self._bars.stop()
        except BaseException:
            # rich's Live, half started (a Ctrl-C inside its start), or
            # interrupted while it stops, fails before it shows the cursor
            # again: the user's shell was left without one.
            self._console.show_cursor(True)
            raise
