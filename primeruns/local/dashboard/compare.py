"""Several runs side by side: training curves overlaid, two evaluations diffed task by task.

The runs list's checkboxes open ``/dashboard/compare?run=A&run=B...``. Training
runs get one chart per metric with a line per run (:func:`.charts.overlay`);
evaluations get a row each, oldest first, and the first two are diffed task
by task (A the older, B the newer: a baseline and what came after) from
their samples' rows (the analysis' per-task figures, so a diff costs what two
analyses cost, whatever the episodes weigh). A task "flipped" when its share
of correct samples moved: with one rollout per task, correct in one run and
wrong in the other. Flipped tasks come first, the largest moves first, since
they are what a comparison is for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .analysis import TaskRow, analyse
from .views import SampleRow

#: The most runs one compare page shows (one colour each); the rest are said.
MAX_COMPARED = 10
#: Task rows a diff lists (flipped first); the rest are counted.
MAX_DIFF_ROWS = 500


def chosen_runs(ids: Iterable[str]) -> list[str]:
    """The distinct run ids asked for, in the order given (a repeat is dropped)."""
    return list(dict.fromkeys(i for i in ids if i))


@dataclass(frozen=True)
class Side:
    """One run's figures for one task (None: the run has no sample of it)."""

    samples: int
    scored: int
    correct: int
    mean_reward: float | None

    @property
    def share(self) -> float | None:
        return self.correct / self.scored if self.scored else None


@dataclass(frozen=True)
class TaskDiff:
    task: str
    a: Side | None
    b: Side | None

    @property
    def shift(self) -> float | None:
        """How far the correct share moved from A to B (None unless both scored it)."""
        if self.a is None or self.b is None or self.a.share is None or self.b.share is None:
            return None
        return self.b.share - self.a.share

    @property
    def reward_shift(self) -> float | None:
        if self.a is None or self.b is None:
            return None
        if self.a.mean_reward is None or self.b.mean_reward is None:
            return None
        return self.b.mean_reward - self.a.mean_reward

    @property
    def change(self) -> str:
        """What happened to the task, as the diff's last column says it."""
        if self.a is None:
            return "only in B"
        if self.b is None:
            return "only in A"
        shift = self.shift
        if shift is None or shift == 0:
            return "same"
        return "fixed" if shift > 0 else "broken"

    @property
    def flipped(self) -> bool:
        return self.change in ("fixed", "broken")


@dataclass(frozen=True)
class EvalDiff:
    tasks: list[TaskDiff]
    #: Samples without a task: matched to nothing, counted per run.
    untasked: tuple[int, int]

    def count(self, change: str) -> int:
        return sum(1 for t in self.tasks if t.change == change)

    @property
    def flipped(self) -> int:
        return self.count("fixed") + self.count("broken")


def _side(row: TaskRow) -> Side:
    return Side(row.samples, row.scored, row.correct, row.mean_reward)


def _order(t: TaskDiff) -> tuple[int, float, float, str]:
    # Flipped first, the largest move first; then by the reward's move; then by name.
    rank = 0 if t.flipped else 1 if t.change == "same" else 2
    return (rank, -abs(t.shift or 0.0), -abs(t.reward_shift or 0.0), t.task)


def diff(a: Sequence[SampleRow], b: Sequence[SampleRow]) -> EvalDiff:
    """Evaluation ``a`` against ``b``, task by task (by their samples' rows)."""
    first, second = analyse(a), analyse(b)
    left: Mapping[str, TaskRow] = {t.task: t for t in first.tasks}
    right: Mapping[str, TaskRow] = {t.task: t for t in second.tasks}
    tasks = [
        TaskDiff(
            task,
            _side(left[task]) if task in left else None,
            _side(right[task]) if task in right else None,
        )
        for task in left.keys() | right.keys()
    ]
    tasks.sort(key=_order)
    return EvalDiff(tasks, (first.untasked, second.untasked))
