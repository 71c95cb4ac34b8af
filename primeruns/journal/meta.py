"""Meta: JSON values by key (format version, local id, owner, platform
binding, lifecycle, the uplink's standing and errors).

Internal keys share the table with the callers' keys under the ``journal.``
prefix. Each value is committed when its call returns; ``update`` and
``push`` change several values, or a list, in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import lmdb

from primeruns.journal.frames import FrameError, decode_frame, peek_header
from primeruns.journal.layout import dumps
from primeruns.journal.txn import Transactions

K_FORMAT = "journal.format_version"
K_LOCAL_ID = "journal.local_id"
K_OWNER = "journal.owner"
K_CREATED = "journal.created_at"
# Not stored: where ``all`` lists the values it left out for their size.
K_OVERSIZED = "journal.oversized"
# A forked child's journal: its parent's local id, and path (``ship.family``).
K_FORK_PARENT = "fork_parent"
K_FORK_PARENT_PATH = "fork_parent_path"
K_BUDGET = "journal.max_bytes"  # the producer's byte budget, which its uplink keeps too


class Meta:
    def __init__(self, tx: Transactions) -> None:
        self._tx = tx

    def get(self, key: str, default: Any = None) -> Any:
        try:
            with self._tx.read() as txn:
                return self._tx.meta(txn, key)
        except KeyError:
            return default

    def all(
        self,
        max_value_bytes: int | None = None,
        shape: Callable[[Any], Any] | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        oversized: dict[str, int] = {}
        with self._tx.read() as txn:
            for key, value in txn.cursor(db=self._tx.dbs["meta"]):
                name = bytes(key).decode(errors="replace")
                try:
                    if max_value_bytes is not None:
                        declared = peek_header(value).raw_len
                        if declared > max_value_bytes:
                            oversized[name] = declared
                            continue
                    decoded = json.loads(decode_frame(value)[1])
                except (FrameError, ValueError, RecursionError):
                    continue
                out[name] = decoded if shape is None else shape(decoded)
        if oversized:
            out[K_OVERSIZED] = oversized
        return out

    def update(self, values: Mapping[str, Any]) -> None:
        encoded = {k: dumps(v) for k, v in values.items()}  # fail on bad JSON before writing

        def put(txn: lmdb.Transaction) -> None:
            for k, v in encoded.items():
                self._tx.put_meta_bytes(txn, k, v)

        self._tx.write(put)

    def push(self, key: str, item: Any, *, cap: int) -> None:
        encoded = json.loads(dumps(item))

        def put(txn: lmdb.Transaction) -> None:
            current = self._tx.meta_or(txn, key, [])
            items = current if isinstance(current, list) else []
            if len(items) < cap:
                self._tx.put_meta(txn, key, [*items, encoded])
            else:
                more = self._tx.meta_or(txn, f"{key}#more", 0)
                self._tx.put_meta(txn, f"{key}#more", int(more or 0) + 1)

        self._tx.write(put)
