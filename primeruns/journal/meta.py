"""Meta: JSON values by key (format version, local id, owner, platform
binding, lifecycle, the uplink's standing and errors).

Internal keys share the table with the callers' keys under the ``journal.``
prefix. Each value is committed when its call returns; ``update`` and
``push`` change several values, or a list, in one transaction.

A journal is untrusted input (copied from another machine, planted in a
shared runs directory), and a frame may declare up to 128 MiB that zstd
packs into a few KB: ``primeruns ls`` decoded such a meta value whole, and a
journal of tens of KB took it to 400 MB. So what ``all`` reads is bounded for the
whole journal (``MAX_META_BYTES`` of JSON, ``MAX_META_VALUES`` values, each
checked before it is decompressed or parsed), and a value past what is left
is not read but named under ``K_OVERSIZED``, which a listing reports as
damage. Honest meta is a few KB: the bound costs it nothing but the
12-byte header read already there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import lmdb

from primeruns import jsonbound
from primeruns.exceptions import JournalCorruptError
from primeruns.journal.dicts import K_DICT_PREFIX
from primeruns.journal.frames import decode_frame, peek_header
from primeruns.journal.layout import dumps
from primeruns.journal.txn import MAX_VALUE_BYTES, MAX_VALUES, Transactions

K_FORMAT = "journal.format_version"
K_LOCAL_ID = "journal.local_id"
K_OWNER = "journal.owner"
K_CREATED = "journal.created_at"
# Not stored: where ``all`` lists the values it left out for their size.
K_OVERSIZED = "journal.oversized"
# Not stored: where ``all`` lists the keys whose values it could not read (a
# frame or JSON damaged): a spec so is a damaged spec, not none (``unreadable``).
K_UNREADABLE = "journal.unreadable"
# Keys only ``all`` makes: one a journal stores under them is passed over.
_READERS_KEYS = frozenset({K_OVERSIZED, K_UNREADABLE})
# A forked child's journal: its parent's local id, and path (``ship.family``).
K_FORK_PARENT = "fork_parent"
K_FORK_PARENT_PATH = "fork_parent_path"
K_BUDGET = "journal.max_bytes"  # the producer's byte budget, which its uplink keeps too

#: Keys a listing's read (``all`` with a bound) passes over, unread and not
#: counted against its bounds: what the sinks carry from batch to batch
#: (``carry.<sink>``, ``carry.<sink>.<part>``: an evaluation's rollout
#: numbering, a few values per example), which no listing shows, and which
#: took a large evaluation's whole listing budget (its other values named
#: oversized, its journal listed as damaged); and the journal's zstd
#: dictionaries (``dicts``: bytes, not JSON, read by the frames that need
#: them), which a listing named unreadable, so that no summary of a journal
#: with one was kept and every page of it counted its entries again.
UNLISTED_PREFIXES = ("carry.", K_DICT_PREFIX)

#: The most JSON ``all`` reads of a journal's meta, and values it decodes, in
#: all: what one value may hold (``txn``); a spec with its config is a few
#: KB (the platform keeps at most 256 KiB of config text).
MAX_META_BYTES = MAX_VALUE_BYTES
MAX_META_VALUES = MAX_VALUES


def unreadable(meta: Mapping[str, Any], key: str) -> bool:
    """Whether ``key``'s value could not be read by the bounded ``Meta.all``
    that read ``meta`` (a listing's): it is left out of ``meta``, as none is,
    yet the journal holds one."""
    names = meta.get(K_UNREADABLE)
    return isinstance(names, list) and key in names


class Meta:
    def __init__(self, tx: Transactions) -> None:
        self._tx = tx

    def get(self, key: str, default: Any = None) -> Any:
        try:
            with self._tx.read() as txn:
                return self._tx.meta(txn, key)
        except KeyError:
            return default

    def get_many(self, keys: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
        """The values stored under ``keys``, in one read (absent keys left
        out), and the keys whose values are damaged (left out too)."""
        found: dict[str, Any] = {}
        damaged: list[str] = []
        with self._tx.read() as txn:
            for key in keys:
                try:
                    found[key] = self._tx.meta(txn, key)
                except KeyError:
                    continue
                except JournalCorruptError:
                    damaged.append(key)
        return found, damaged

    def all(
        self,
        max_value_bytes: int | None = None,
        shape: Callable[[Any], Any] | None = None,
    ) -> dict[str, Any]:
        """Every readable meta value by key. Given ``max_value_bytes`` (a
        listing's read), those past it, or past what is left of the whole
        meta's bound, by declared size under ``K_OVERSIZED`` (neither
        decompressed nor parsed), those that cannot be read by name under
        ``K_UNREADABLE``, and the keys of ``UNLISTED_PREFIXES`` not
        at all. Without it, every value whole: the SDK
        reads back what it wrote (a copy's or a re-homed journal's spec and
        its config, which may be of any size)."""
        if max_value_bytes is None:
            return self._all_whole(shape)
        out: dict[str, Any] = {}
        oversized: dict[str, int] = {}
        unreadable: list[str] = []
        most = max_value_bytes
        bytes_left, values_left = MAX_META_BYTES, MAX_META_VALUES
        with self._tx.read() as txn:
            for key, value in txn.cursor(db=self._tx.dbs["meta"]):
                name = bytes(key).decode(errors="replace")
                if name.startswith(UNLISTED_PREFIXES) or name in _READERS_KEYS:
                    continue
                try:
                    declared = peek_header(value).raw_len
                    if declared > min(most, bytes_left):
                        oversized[name] = declared
                        continue
                    text = decode_frame(value, max_bytes=declared)[1]
                    # Counted before parsing, at C speed: a few KB of honest
                    # meta costs microseconds, a bomb of tiny containers nothing.
                    values = text.count(b",") + text.count(b"[") + text.count(b"{")
                    if values > values_left:
                        oversized[name] = declared
                        continue
                    decoded = jsonbound.loads(text, declared, values_left)
                except ValueError:  # a bad frame (the full scan names it too), or not JSON
                    unreadable.append(name)
                    continue
                bytes_left -= declared
                values_left -= values
                out[name] = decoded if shape is None else shape(decoded)
        if oversized:
            out[K_OVERSIZED] = oversized
        if unreadable:
            out[K_UNREADABLE] = unreadable
        return out

    def _all_whole(self, shape: Callable[[Any], Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with self._tx.read() as txn:
            for key, value in txn.cursor(db=self._tx.dbs["meta"]):
                try:
                    decoded = json.loads(decode_frame(value)[1])
                except (ValueError, RecursionError):  # a bad frame, which the full scan names
                    continue
                out[bytes(key).decode(errors="replace")] = (
                    decoded if shape is None else shape(decoded)
                )
        return out

    def update(self, values: Mapping[str, Any], drop: Iterable[str] = ()) -> None:
        encoded = {k: dumps(v) for k, v in values.items()}  # fail on bad JSON before writing

        def put(txn: lmdb.Transaction) -> None:
            for k, v in encoded.items():
                self._tx.put_meta_bytes(txn, k, v)
            for k in drop:
                txn.delete(k.encode(), db=self._tx.dbs["meta"])

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
