"""The training sample table: one Parquet object per step upload, through
presign, then PUT to object storage, then confirm (contract §3.6, §3.7, §5.3).

Only episodes of training work on the cadence (every ``interval``-th step)
become rows; others are skipped, which is not a loss. A batch's objects are
built once, numbered in their own ``sample_id`` range and stamped with one
``created_at``, and recorded in the journal before the first attempt; the
presigned key is recorded as soon as it is minted. A resend after a crash or a
lost answer therefore PUTs the same bytes to the same key and confirms it
again (confirm is idempotent), and never makes a second object of the same
records.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from ..journal import Entry, EntryKind
from ..platform import PlatformClient
from ..projection import episodes_to_parquet_bytes, parquet_available
from ..records import training_step
from .base import Binding, Prepared, SendContext, SinkOff

__all__ = ["DEFAULT_INTERVAL", "TrainSamplesSink", "pack_units", "unpack_units"]

DEFAULT_INTERVAL = 10
_LEN = struct.Struct(">I")


def pack_units(units: list[tuple[dict[str, Any], bytes]]) -> bytes:
    """A batch body: a JSON header naming each object, then the objects."""
    header = orjson.dumps([meta for meta, _ in units])
    return _LEN.pack(len(header)) + header + b"".join(blob for _, blob in units)


def unpack_units(body: bytes) -> list[tuple[dict[str, Any], bytes]]:
    (size,) = _LEN.unpack_from(body)
    metas = orjson.loads(body[_LEN.size : _LEN.size + size])
    out: list[tuple[dict[str, Any], bytes]] = []
    offset = _LEN.size + size
    for meta in metas:
        out.append((meta, body[offset : offset + meta["bytes"]]))
        offset += meta["bytes"]
    return out


def _field(data: dict[str, Any], *names: str) -> Any:
    inner = data.get("data")
    for source in (inner if isinstance(inner, dict) else {}, data):
        for name in names:
            if source.get(name):
                return source[name]
    return None


class TrainSamplesSink:
    name = "train_samples"
    kinds = frozenset({EntryKind.EPISODE})
    max_entries = 512
    max_bytes = 64 * 1024 * 1024
    isolates_rejections = False

    def __init__(
        self, client: PlatformClient, *, interval: int = DEFAULT_INTERVAL, range_base: int = 0
    ) -> None:
        self._client = client
        self._interval = interval
        # Next range index per step. A forked child starts at a random base so
        # it never reuses its parent's ranges.
        self._range_base = range_base
        self._ranges: dict[int, int] = {}

    def restore(self, carry: dict[str, Any]) -> None:
        ranges = carry.get("ranges")
        if isinstance(ranges, dict):
            self._ranges = {int(k): int(v) for k, v in ranges.items()}

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared | None:
        if not parquet_available():
            raise SinkOff(
                "pyarrow is not installed, so the training sample table is off; "
                "install prime-runs[train] to enable it (primeruns replay from a machine "
                "that has it ships the table)",
                lasting=False,
            )
        by_step: dict[int, list[dict[str, Any]]] = {}
        for entry in entries:
            record = orjson.loads(entry.payload)
            step = training_step(record)
            if step is None or step % self._interval:
                continue
            by_step.setdefault(step, []).append(record)
        if not by_step:
            return None
        created_at = datetime.now(UTC)
        units: list[tuple[dict[str, Any], bytes]] = []
        records = 0
        for step in sorted(by_step):
            index = self._ranges.get(step, self._range_base)
            self._ranges[step] = index + 1
            blob = episodes_to_parquet_bytes(
                by_step[step],
                binding.run_id,
                step,
                sample_id_offset=index << 32,
                created_at=created_at,
            )
            if blob is None:
                continue
            units.append(({"step": step, "range": index, "bytes": len(blob)}, blob))
            records += len(by_step[step])
        carry = {"ranges": {str(k): v for k, v in self._ranges.items()}}
        if not units:
            return None
        return Prepared(body=pack_units(units), state={"done": 0, "carry": carry}, records=records)

    def send(self, body: bytes, ctx: SendContext) -> None:
        run_id = ctx.binding.run_id
        units = unpack_units(body)
        for index in range(int(ctx.state.get("done", 0)), len(units)):
            meta, blob = units[index]
            step = meta["step"]
            key, url = ctx.state.get("key"), ctx.state.get("url")
            if not key or not url:
                minted = self._client.api(
                    "POST", "/rft/samples/presign", {"run_id": run_id, "step": step}
                )
                url = _field(minted, "presignedUrl", "presigned_url")
                key = _field(minted, "s3Key", "s3_key")
                if not url or not key:
                    raise ValueError("presign answered without an upload URL and key")
                ctx.save_state({"key": key, "url": url})
            self._client.put_object(str(url), blob, "application/parquet")
            self._client.api(
                "POST", "/rft/samples/confirm", {"run_id": run_id, "step": step, "s3_key": key}
            )
            ctx.save_state({"done": index + 1, "key": None, "url": None})
