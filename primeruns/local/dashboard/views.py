"""What the dashboard's pages show, independent of where it is read from.

A :class:`Source` answers the pages' questions (the runs, one run, a page of
its samples, one sample, a training step's rows); the platform's database and
a directory of journals each implement it. Keeping the views plain data means
the templates never touch SQLite or LMDB, and both sources are held to the
same shapes by the type checker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

#: The real platform's dashboard sections, and the run kind each shows.
SECTIONS = {"evaluations": "eval", "training": "train"}
SECTION_OF = {kind: section for section, kind in SECTIONS.items()}

#: Statuses after which a run's page no longer changes (the page stops polling).
#: Statuses of either source: the platform's, and a journal's finish record.
FINAL_STATUSES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "STOPPED", "CRASHED", "DAMAGED", "FINISHED"}
)


@dataclass(frozen=True)
class RunRow:
    """One run as the runs list shows it."""

    id: str
    kind: str | None
    name: str | None
    model: str | None
    status: str
    error: str | None
    created_at: float | None
    updated_at: float | None
    #: What landed, by what it is called on the page ("episodes", "samples", ...).
    counts: dict[str, int] = field(default_factory=dict)
    #: Records a sink gave up on, per sink (known for journals only).
    losses: dict[str, int] = field(default_factory=dict)
    #: What is wrong with a journal that could not be read whole.
    damage: list[str] = field(default_factory=list)
    #: A journal's shipping state as ``primeruns ls`` says it (shipped, offline...).
    journal: str | None = None
    #: The environments it ran, by name where known (else slug or id).
    environments: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    @property
    def section(self) -> str:
        return SECTION_OF.get(self.kind or "", "evaluations")

    @property
    def live(self) -> bool:
        return self.status.upper() not in FINAL_STATUSES


@dataclass(frozen=True)
class StepTable:
    """A training step's sample table (a Parquet object on the platform)."""

    step: int
    rows: int
    key: str | None = None


@dataclass(frozen=True)
class RunDetail:
    """One run's page: its row, summary, config and, for training, its curves."""

    row: RunRow
    summary: dict[str, Any]
    #: The config file's text as stored (``config_source``), when there is one.
    config_text: str | None
    #: The config as a mapping (shown when there is no source text).
    config: dict[str, Any]
    max_steps: int | None = None
    #: The training metric rows, each with its ``step``, in step order.
    metrics: list[dict[str, Any]] = field(default_factory=list)
    #: Said by the curves when the rows were thinned to the bound (``MetricRows.cut``).
    thinned: str | None = None
    step_tables: list[StepTable] = field(default_factory=list)
    #: Read from a journal: only every this-many-th step's table is shipped, so
    #: only those are shown (the platform stores no other).
    tables_every: int | None = None


@dataclass(frozen=True)
class SampleRow:
    """One row of an evaluation's sample table."""

    #: 0-based position in the run's samples: the sample's address on the page
    #: (``/samples/0`` is the first, as ``/steps/0`` is the first step).
    index: int
    sample_id: str | None
    reward: float | None
    error: str | None
    task: str | None
    #: Tokens the episode read and wrote, where its record counts them (``rows.token_counts``).
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: What kind of error ``error`` is (``rows.error_category``): its type, else its first line.
    category: str | None = None

    @property
    def correct(self) -> bool | None:
        """Correct when its reward is positive (the rewards are the verifier's scores)."""
        return None if self.reward is None else self.reward > 0

    @property
    def tokens(self) -> int | None:
        """Input and output tokens together; None when the record counts neither."""
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)


#: Most samples an evaluation's analysis and sortable table hold (the rest are said).
MAX_FACTS = 100_000
#: The longest task label, sample id or error a held row keeps.
MAX_FACT_CHARS = 300


_new = object.__new__


def sample_row_of(
    index: int,
    sample_id: str | None,
    reward: float | None,
    error: str | None,
    task: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
    category: str | None,
) -> SampleRow:
    """``SampleRow(...)`` for a row made per sample of a run (its analysis reads
    every one): the same fields, set without a frozen dataclass's ``__init__``
    (an ``object.__setattr__`` a field, half of what a 20,000-episode run's
    rows cost once each was read)."""
    row: SampleRow = _new(SampleRow)
    row.__dict__.update(
        index=index,
        sample_id=sample_id,
        reward=reward,
        error=error,
        task=task,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        category=category,
    )
    return row


def _short(text: str | None) -> bool:
    return text is None or len(text) <= MAX_FACT_CHARS


def compact(row: SampleRow) -> SampleRow:
    """``row`` with its texts cut to ``MAX_FACT_CHARS``: held for the whole run."""

    def cut(text: str | None) -> str | None:
        if text is None or len(text) <= MAX_FACT_CHARS:
            return text
        return text[: MAX_FACT_CHARS - 1] + "…"

    if _short(row.sample_id) and _short(row.error) and _short(row.task):
        return row  # the usual row: nothing to cut, nothing to copy
    return replace(row, sample_id=cut(row.sample_id), error=cut(row.error), task=cut(row.task))


class MissingExtra(Exception):
    """A page needs a package this installation lacks; the message names the install."""


def config_text(config: dict[str, Any]) -> str | None:
    """The config file's text a run was started from (``config_source``), if stored."""
    source = config.get("config_source")
    text = source.get("text") if isinstance(source, dict) else None
    return text if isinstance(text, str) else None


class Source(Protocol):
    """Where the pages read from. Every method is synchronous and read-only."""

    def runs(self) -> list[RunRow]: ...

    def run(self, run_id: str) -> RunDetail | None: ...

    def samples(self, run_id: str, offset: int, limit: int) -> tuple[list[SampleRow], int]:
        """A page of the run's samples and the run's total."""
        ...

    def sample_facts(self, run_id: str, limit: int) -> tuple[list[SampleRow], int]:
        """Every sample's row, in order, up to ``limit`` (each :func:`compact`), and
        the run's total: what the analysis and the sortable table read. Kept
        between pages and brought up to date, like a journal's index."""
        ...

    def sample(self, run_id: str, index: int) -> dict[str, Any] | None:
        """The sample at 0-based ``index`` as a v0 sample row, or None."""
        ...

    def step_rows(
        self, run_id: str, step: int, offset: int = 0, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], int] | None:
        """A page of a training step's sample-table rows (``limit`` None: all
        from ``offset``) and how many the step has; None if it has none.

        Raises :class:`MissingExtra` when reading them needs pyarrow and it is missing.
        """
        ...
