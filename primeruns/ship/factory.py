"""Which sinks a run has, and their shippers: one place, for a live run, a
restarted one, ``primeruns replay`` and ``primeruns sync`` alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..journal import EntryKind, Journal, in_memory
from ..platform import PlatformClient
from ..platform.plain import importing
from ..ranks import Role, written_in
from ..sinks.base import Sink
from ..sinks.eval_samples import EvalSamplesSink
from ..sinks.kinds import SINK_KINDS, sink_kinds, sink_names
from ..sinks.traces import TracesSink
from .lifecycle import Lifecycle
from .parsed import SharedRecords
from .policy import RetryPolicy
from .sharedreads import KEEP_BYTES, TRAINING_KEEP_BYTES, SharedReads
from .shipper import Shipper

if TYPE_CHECKING:  # pragma: no cover
    from ..sinks.step_ranges import Block
    from ..sinks.step_rows import StepRows

__all__ = ["make_shippers", "sink_kinds", "sink_names"]


def make_shippers(
    journal: Journal,
    client: PlatformClient,
    lifecycle: Lifecycle,
    *,
    opted_out: bool,
    policy: RetryPolicy,
    on_failure: Callable[[str, BaseException], None],
    on_loss: Callable[[str, BaseException], None] | None = None,
    ranges: Block | None = None,
    on_progress: Callable[[], None] | None = None,
) -> list[Shipper]:
    spec = lifecycle.spec
    kind = spec.kind
    context = {"source": "prime-runs", "run_type": kind}
    if spec.framework:
        context["framework"] = spec.framework
    if spec.model:
        context["model"] = spec.model
    shared = None
    reads = None
    samples = "train_samples" if kind == "train" else "eval_samples"
    if not opted_out and not _turned_off(journal, "traces", samples):
        # Both take every episode: it is read once for the two (ship.sharedreads)
        reads = SharedReads(
            journal,
            SINK_KINDS["traces"] | SINK_KINDS[samples],
            keep_bytes=TRAINING_KEEP_BYTES if kind == "train" else KEEP_BYTES,
        )
        if kind != "train":
            # and, in an evaluation, parsed once (ship.parsed).
            shared = SharedRecords({EntryKind.EPISODE: 2})
    sinks: list[Sink] = [
        TracesSink(
            None if opted_out else client,
            context=context,
            opted_out=opted_out,
            committed=int(journal.get_meta("traces_receipts", 0) or 0),
            line=None if shared is None else shared.line,
        )
    ]
    if kind == "train":
        # Only a training run's: an evaluation's process never loads them
        # (with step_rows, sqlite3). Shippers may be made in an uplink's
        # thread (threads mode, a predecessor taken over): a fork waits for
        # the import (``platform.plain.importing``).
        with importing():
            from ..sinks.train_metrics import TrainMetricsSink
            from ..sinks.train_samples import TrainSamplesSink
        sinks.append(TrainSamplesSink(client, ranges=ranges))
        sinks.append(TrainMetricsSink(client, _step_rows(journal, lifecycle, client)))
    else:
        sinks.append(EvalSamplesSink(client, rows=None if shared is None else shared.rows))
    shippers = [
        Shipper(
            journal,
            sink,
            binding=lifecycle.binding,
            training=kind == "train",
            policy=policy,
            on_failure=on_failure,
            on_loss=on_loss,
            on_progress=on_progress,
            reads=reads,
            records=shared if sink.name in ("traces", "eval_samples") else None,
        )
        for sink in sinks
    ]
    # While space is short, what all of them acknowledged is compacted away.
    journal.set_sinks([s.name for s in shippers if s.state.off_reason is None])
    return shippers


def _turned_off(journal: Journal, *names: str) -> bool:
    """Whether an earlier process turned any of these sinks off for good
    (its shipper then takes nothing: see ``Shipper``)."""
    return any(journal.get_meta(f"sink_off.{name}") is not None for name in names)


def _step_rows(journal: Journal, lifecycle: Lifecycle, client: PlatformClient) -> StepRows | None:
    """Where this journal's metrics rows meet those of the run's other
    processes on this host: beside the journals, in the runs directory it was
    written in (a replayed journal's original's); a table made there anew
    starts from the run's rows on the platform. None for a journal in
    memory: no folder took it, so none takes the table either."""
    if in_memory(journal):
        return None
    role = Role.of(journal) or Role(primary=lifecycle.owns_run(), label=journal.local_id)
    runs_dir, _ = written_in(journal)
    with importing():  # (a training run's only: see make_shippers)
        from ..sinks.step_rows import StepRows
        from ..sinks.train_metrics import landed_rows
    return StepRows(
        runs_dir,
        label=role.label,
        primary=role.primary,
        rank=role.rank,
        landed=functools.partial(landed_rows, client),
        shipped_before=journal.acked("train_metrics") > 0,
    )
