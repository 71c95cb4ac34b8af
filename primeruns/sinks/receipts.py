"""What proves a sink's request was stored: each endpoint's answer, checked.

A 2xx alone proves nothing. A gateway in front of the platform may answer 200
with an empty body or ``{}``, and a maintenance page may answer 200 with
HTML. A sink that counted those as stored lost every record of the batch
(issue #28). So each sink hands its answer to a check here:

- **Prime Traces** (contract §4.4): the receipt must say ``status:
  "committed"`` and name the upload (``upload_id``, the digest the
  Idempotency-Key carries). Nothing else is a receipt.
- **The evaluation sample table, training metrics, a sample object's
  confirm** (§8.1): the platform may answer any JSON object or an empty body.
  A silent answer can be neither refused (a real platform that answers so
  would have its successes retried forever) nor trusted. An answer carrying
  the documented fields (what ``primeruns serve`` sends) is proof when they
  match the request and refused when they do not. A silent one is checked by
  reading the rows back where the platform offers a read (the sinks do
  that); where it offers none (a confirm), by asking again, which is
  idempotent: a silent answer from a platform seen naming its keys is a
  gateway's, and two in a row from one never seen to are taken as the
  contract allows.
- **Presign** (§3.6): the URL and the key must be there. Without them nothing
  can be uploaded, and minting again is harmless.
- **A read-back** must have the documented shape (a list under its key):
  ``{}`` from a gateway says nothing about what is stored.

A failed check raises :class:`UnprovenAnswerError`. That is transient and
ambiguous: the shipper resends the batch (every sink's resend is
replay-safe: content addressed, looked for first, or collapsing per step)
and never counts it as stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..exceptions import UnprovenAnswerError
from ..redaction import scrub

__all__ = [
    "check_traces",
    "confirm_proves",
    "count",
    "metrics_proves",
    "page_items",
    "presigned",
    "samples_prove",
    "unproven",
]


def unproven(what: str) -> UnprovenAnswerError:
    """The error for an answer that is not proof (``what`` says how)."""
    return UnprovenAnswerError(f"{what}; not counted as stored, sending again")


def _shown(value: Any) -> str:
    """A server's value, for a message: scrubbed as error bodies are, then
    cut short (cut first, a key echoed across the cut would show in part)."""
    return scrub(repr(value))[:200]


def check_traces(answer: Mapping[str, Any], key: str) -> None:
    """Raise unless ``answer`` is the committed receipt of the upload ``key``."""
    status = answer.get("status")
    if status != "committed":
        raise unproven(
            f"Prime Traces answered without a committed receipt (status {_shown(status)})"
        )
    digest = key.removeprefix("sha256:")
    if answer.get("upload_id") != digest:
        raise unproven(
            f"Prime Traces answered with the receipt of another upload "
            f"(upload_id {_shown(answer.get('upload_id'))}, expected {digest})"
        )


def samples_prove(answer: Mapping[str, Any], rows: int, eval_id: str) -> bool:
    """Whether a samples push's answer proves its ``rows`` were appended: True
    when it names the evaluation and the rows, False when it says nothing
    (look for the rows); raises when it says something else."""
    inserted = answer.get("inserted")
    named = answer.get("evaluation_id")
    if inserted is None and named is None:
        return False
    if named is not None and str(named) != eval_id:
        raise unproven(f"the samples push was answered for evaluation {_shown(named)}")
    if count(inserted) != rows:  # (``inserted: true`` is no count of one row)
        raise unproven(
            f"the samples push of {rows} rows was answered 'inserted: {_shown(inserted)}'"
        )
    return True


def metrics_proves(answer: Mapping[str, Any], run_id: str, step: Any) -> bool:
    """Whether a metrics row's answer proves it stored: True when it names the
    run (and the step, if it names one), False when it says nothing (look the
    row up); raises when it names another run or step."""
    named = answer.get("run_id")
    if named is None:
        return False
    if str(named) != run_id:
        raise unproven(f"the metrics row was answered for run {_shown(named)}")
    if "step" in answer and answer["step"] != step:
        raise unproven(
            f"the metrics row of step {step} was answered for step {_shown(answer['step'])}"
        )
    return True


def confirm_proves(answer: Mapping[str, Any], key: str) -> bool:
    """Whether a confirm's answer proves the object registered: True when it
    names the key (or says confirmed), False when it says nothing; raises when
    it names another key."""
    named = answer.get("s3_key", answer.get("s3Key"))
    if named is not None and named != key:
        raise unproven(f"the confirm of {key} was answered for {_shown(named)}")
    return named is not None or answer.get("status") == "confirmed"


def presigned(answer: Mapping[str, Any]) -> tuple[str, str]:
    """The upload URL and object key of a presign answer (in ``data`` or at
    the top, either spelling); raises when either is missing."""
    inner = answer.get("data")
    url = key = None
    for source in (inner if isinstance(inner, dict) else {}, answer):
        url = url or source.get("presignedUrl") or source.get("presigned_url")
        key = key or source.get("s3Key") or source.get("s3_key")
    if not url or not key:
        raise unproven("presign answered without an upload URL and key")
    return str(url), str(key)


def count(value: Any) -> int | None:
    """``value`` as a count of rows, or None where it is none. A JSON store
    may keep every number as a double (``5.0`` for ``5``, as
    ``ship/readback.py`` allows for a summary): a float of integral value is
    that count. A boolean (``True == 1`` in Python) or a fraction is not."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def page_items(answer: Mapping[str, Any], name: str) -> list[Any]:
    """The list a read-back page holds under ``name``; raises when it has none
    (``{}`` from a gateway is not an empty table)."""
    items = answer.get(name)
    if not isinstance(items, list):
        raise UnprovenAnswerError(
            f"a read-back was answered without its {name!r} list; cannot tell what is stored"
        )
    return items
