"""An evaluation's figures beyond its averages: the reward histogram, pass@k, a row
per task, token usage and the errors by category.

They are computed from each sample's row (:class:`~.views.SampleRow`: its
task, reward, error and its category, tokens), in one pass, never from the
episodes themselves, so a page costs what those rows hold, whatever the
episodes weigh. A sample is correct when
its reward is positive (the rewards are the verifier's scores, as the samples
table says); one without a reward is neither and is left out of pass@k.

Token usage sums each sample's input and output tokens (``rows.token_counts``)
over the samples whose records count them, and says how many do; errors are
grouped by their category (``rows.error_category``: the error's type), the
most frequent first.

pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large
Language Models Trained on Code"): for a task of ``n`` samples of which ``c``
are correct, ``1 - C(n-c, k) / C(n, k)``, averaged over the tasks that have
at least ``k`` samples; ``k`` goes up to the most samples any task has.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .views import SampleRow

#: Bins of the reward histogram.
BINS = 10
#: Up to this many samples per task every k is shown; past it, powers of two and the last.
MAX_EVERY_K = 16


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    count: int
    #: The count as a share of the fullest bin's (the bar's length).
    share: float


@dataclass(frozen=True)
class PassAt:
    k: int
    value: float
    #: How many tasks have at least ``k`` scored samples (the mean is over them).
    tasks: int


@dataclass(frozen=True)
class TaskRow:
    task: str
    samples: int
    #: Samples with a reward; ``correct`` of them positive.
    scored: int
    correct: int
    mean_reward: float | None
    errors: int
    #: Tokens (input and output) over the task's samples that count them.
    tokens: int = 0


@dataclass(frozen=True)
class Tokens:
    """Token usage over the samples whose records count tokens (``counted`` of them)."""

    counted: int = 0
    input: int = 0
    output: int = 0
    #: The most output tokens of one sample.
    most_output: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output

    @property
    def mean_input(self) -> float | None:
        return self.input / self.counted if self.counted else None

    @property
    def mean_output(self) -> float | None:
        return self.output / self.counted if self.counted else None


@dataclass(frozen=True)
class Category:
    """The samples whose errors are of one kind (``SampleRow.category``)."""

    name: str
    samples: int
    #: Its share of all the samples.
    share: float
    #: One of its samples' error as the table shows it (the first).
    example: str


@dataclass(frozen=True)
class Analysis:
    samples: int
    scored: int
    correct: int
    errors: int
    mean_reward: float | None
    histogram: list[Bin]
    pass_at: list[PassAt]
    tasks: list[TaskRow]
    #: Samples without a task: in the histogram, not in pass@k or the task table.
    untasked: int
    tokens: Tokens = Tokens()
    #: The errors by category, the most frequent first.
    categories: list[Category] = field(default_factory=list)


def histogram(rewards: Sequence[float], bins: int = BINS) -> list[Bin]:
    """``bins`` equal bins from the lowest reward to the highest (one when all are equal)."""
    if not rewards:
        return []
    low, high = min(rewards), max(rewards)
    width = (high - low) / bins
    if low == high or not math.isfinite(width):  # equal, or too far apart to split
        return [Bin(low, high, len(rewards), 1.0)]
    counts = [0] * bins
    for reward in rewards:
        counts[min(int((reward - low) / width), bins - 1)] += 1  # the highest goes in the last
    most = max(counts)
    return [Bin(low + i * width, low + (i + 1) * width, n, n / most) for i, n in enumerate(counts)]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` of ``n`` samples (``c`` correct) is correct."""
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) as a product: no huge binomials.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _ks(most: int) -> list[int]:
    if most <= MAX_EVERY_K:
        return list(range(1, most + 1))
    ks = [1 << p for p in range(most.bit_length()) if 1 << p < most]
    return [*ks, most]


def analyse(rows: Iterable[SampleRow]) -> Analysis:
    samples = errors = 0
    rewards: list[float] = []
    by_task: dict[str, list[int]] = {}  # samples, scored, correct, errors, tokens
    sums: dict[str, float] = {}
    untasked = 0
    counted = read = written = most_written = 0
    categories: dict[str, list[Any]] = {}  # samples, the first's error
    isfinite = math.isfinite
    # Once per sample of the run (20,000 on a first visit): each row's fields
    # read once, finiteness and ``SampleRow.tokens`` inline.
    for row in rows:
        samples += 1
        reward, error, task = row.reward, row.error, row.task
        scored = reward is not None and isfinite(reward)
        if scored:
            assert reward is not None
            rewards.append(reward)
        errors += error is not None
        if row.category is not None:
            category = categories.setdefault(row.category, [0, error])
            category[0] += 1
        input_tokens, output_tokens = row.input_tokens, row.output_tokens
        counts = input_tokens is not None or output_tokens is not None
        tokens = (input_tokens or 0) + (output_tokens or 0)
        if counts:
            counted += 1
            read += input_tokens or 0
            written += output_tokens or 0
            if (output_tokens or 0) > most_written:
                most_written = output_tokens or 0
        if task is None:
            untasked += 1
            continue
        tally = by_task.get(task)
        if tally is None:
            tally = by_task[task] = [0, 0, 0, 0, 0]
        tally[0] += 1
        tally[3] += error is not None
        tally[4] += tokens
        if scored:
            assert reward is not None
            tally[1] += 1
            tally[2] += reward > 0
            sums[task] = sums.get(task, 0.0) + reward
    tasks = [
        TaskRow(task, n, scored, correct, sums[task] / scored if scored else None, errs, tokens)
        for task, (n, scored, correct, errs, tokens) in sorted(by_task.items())
    ]
    most = max((t.scored for t in tasks), default=0)
    pass_at = []
    for k in _ks(most):
        over = [t for t in tasks if t.scored >= k]
        value = sum(pass_at_k(t.scored, t.correct, k) for t in over) / len(over)
        pass_at.append(PassAt(k, value, len(over)))
    return Analysis(
        samples=samples,
        scored=len(rewards),
        correct=sum(1 for r in rewards if r > 0),
        errors=errors,
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        histogram=histogram(rewards),
        pass_at=pass_at,
        tasks=tasks,
        untasked=untasked,
        tokens=Tokens(counted, read, written, most_written),
        categories=[
            Category(name, n, n / samples, example or "")
            for name, (n, example) in sorted(categories.items(), key=lambda c: (-c[1][0], c[0]))
        ],
    )
