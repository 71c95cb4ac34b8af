"""Training metrics: one row per ``log_metrics`` call, on its own shipper so a
slow sample upload never holds a curve back (see docs/ARCHITECTURE.md, "The wire").

Each journal entry is the finished row (values cleaned, ``step`` and
``_timestamp`` set when it was logged), so a resend carries the same
timestamp. The platform keeps one row per step, which makes a replay after an
ambiguous failure harmless; rows of a batch already stored are still skipped
on resend, because the batch records how far it got.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..exceptions import NotFoundError, is_record_rejection
from ..journal import Entry, EntryKind
from ..platform import PlatformClient
from . import receipts
from .base import Binding, Prepared, SendContext
from .step_rows import StepRows

__all__ = ["MetricsProgress", "TrainMetricsSink"]

# A step other processes keep changing is sent again at most this often per
# row (each round is one request): they send it themselves anyway.
_MAX_ROUNDS = 20


@dataclass(frozen=True)
class MetricsProgress:
    """How many rows of the batch are stored (each is its own request). No
    default: a new batch's record says ``done: 0``, as it always has."""

    done: int


class TrainMetricsSink:
    name = "train_metrics"
    kinds = frozenset({EntryKind.METRICS})
    max_entries = 200
    max_bytes = 4 * 1024 * 1024
    isolates_rejections = False
    progress_type = MetricsProgress

    def __init__(self, client: PlatformClient, steps: StepRows | None = None) -> None:
        """``steps``: where the rows of the run's processes on this host are
        merged per step (``sinks.step_rows``); None sends each row as logged."""
        self._client = client
        self._steps = steps

    def prepare(
        self, entries: Sequence[Entry], binding: Binding
    ) -> Prepared[MetricsProgress] | None:
        body = b"[" + b",".join(entry.payload for entry in entries) + b"]"
        return Prepared(body=body, records=len(entries), progress=MetricsProgress(done=0))

    def send(self, body: bytes, ctx: SendContext[MetricsProgress]) -> None:
        rows = orjson.loads(body)
        for index in range(ctx.progress.done, len(rows)):
            try:
                self._send_row(ctx.binding.run_id, rows[index])
            except Exception as exc:
                if not is_record_rejection(exc):
                    raise
                ctx.reject(1, exc)  # this row only; the rest of the batch goes on
            ctx.save_progress(replace(ctx.progress, done=index + 1))

    def _send_row(self, run_id: str, row: dict[str, Any]) -> None:
        """One logged row: merged with what the run's other processes on this
        host logged for its step, and sent again while they change the step
        (``sinks.step_rows``: the last request to land carries every key)."""
        step = row.get("step")
        steps = self._steps
        if steps is None or not isinstance(step, int) or isinstance(step, bool):
            self._post({"run_id": run_id, "metrics": row})
            return
        table = f"{self._client.settings.api_root} {run_id}"
        for _ in range(_MAX_ROUNDS):
            merged = steps.merge(table, step, row)
            if merged is None:  # the table cannot be used: the row as logged
                self._post({"run_id": run_id, "metrics": row})
                return
            self._post({"run_id": run_id, "metrics": merged[0]})
            if steps.version(table, step) in (merged[1], None):
                return

    def _post(self, payload: dict[str, Any]) -> None:
        """One row, proven stored: by its answer, else by reading it back."""
        run_id, step = payload["run_id"], payload["metrics"].get("step")
        answer = self._client.api("POST", "/rft/metrics", payload)
        if receipts.metrics_proves(answer, run_id, step) or self._stored(run_id, step):
            return
        raise receipts.unproven(
            f"the metrics row of step {step} was answered without a receipt "
            "and is not among the run's rows"
        )

    def _stored(self, run_id: str, step: Any) -> bool:
        """Whether the run's row of ``step`` is on the platform. A row without
        a step cannot be looked up, nor can any where the platform offers no
        read (the internal API): the silent answer is taken, as the contract
        allows."""
        if not isinstance(step, int):
            return True
        try:
            page = self._client.api(
                "GET",
                f"/rft/runs/{run_id}/metrics",
                params={"min_step": step, "max_step": step, "limit": 10},
            )
        except NotFoundError:
            return True
        return any(
            isinstance(row, dict) and row.get("step") == step
            for row in receipts.page_items(page, "metrics")
        )
