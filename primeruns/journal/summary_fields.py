"""A listed journal (``JournalInfo``) as its summary's fields, and back, checked.

``listing`` keeps what it read of a journal in a summary (``summary``: where,
and when one is current); this is what those fields are. A summary is
written by this package, but read back as untrusted: every field is checked,
and one that is not as written makes the summary missing (``info_from``
returns None), so the journal is read instead.

- ``meta``: every meta value as the journal holds it (never shaped by a
  bounded reader), with the encoded size of the large ones (``meta_bytes``),
  so a bounded reader leaves out from a summary what it would have left out
  reading the journal;
- ``last_seq``, ``cursors``, ``losses`` and ``finish``, as a listing reads them;
- ``after``: the tallies of ``tally=True``, when a listing counted them;
- ``verified``: the damage a full scan found (``verify=True``), with the boot
  it was found in: a spool's torn tail is damage only after a reboot
  (``torn``), so a scan of another boot is not used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primeruns.journal.layout import dumps
from primeruns.journal.meta import K_LOCAL_ID, K_OVERSIZED
from primeruns.journal.origin import boot_id
from primeruns.journal.types import Damage, JournalInfo, as_count, is_loss_record

__all__ = ["MetaBounds", "fields_of", "info_from", "local_id_of", "verified_in"]

#: How ``list_journals`` reads meta values: (largest value decoded, applied to each), or None.
MetaBounds = tuple[int, Callable[[Any], Any]] | None


def local_id_of(meta: dict[str, Any], path: Path) -> str:
    """The run's local id: its meta's, else its folder's name."""
    local_id = meta.get(K_LOCAL_ID)
    return local_id if isinstance(local_id, str) else path.name


def fields_of(
    read: dict[str, Any],
    after: dict[int, Counter[int]] | None,
    verified: list[Damage] | None,
    earlier: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The fields of a summary of what a listing ``read`` (meta as it is,
    ``last_seq``, ``cursors``, ``losses``, ``finish``), its tallies and full
    scan if it made them, else those of the ``earlier`` summary of the same
    files; None when the meta cannot be sized (nothing is kept then)."""
    try:
        sizes = {k: n for k, v in read["meta"].items() if (n := len(dumps(v))) > _SMALL_META}
    except (RecursionError, ValueError):
        return None
    fields = {
        **read,
        "meta_bytes": sizes,
        "after": None
        if after is None
        else {str(at): {str(k): n for k, n in counts.items()} for at, counts in after.items()},
        "verified": None
        if verified is None
        else {"boot": boot_id(), "damage": [[d.seq, d.what, d.entries] for d in verified]},
    }
    for name in ("after", "verified"):
        if fields[name] is None:
            fields[name] = (earlier or {}).get(name)
    return fields


def verified_in(kept: dict[str, Any]) -> list[Any] | None:
    """The full scan's damage a summary holds, if it was made in this boot of
    this machine (a spool's torn tail is damage only after a reboot: ``torn``)."""
    verified = kept.get("verified")
    if not isinstance(verified, dict) or verified.get("boot") != boot_id():
        return None
    found = verified.get("damage")
    return found if isinstance(found, list) else None


def info_from(
    kept: dict[str, Any], base: dict[str, Any], *, verify: bool, meta_bounds: MetaBounds
) -> JournalInfo | None:
    """The JournalInfo a summary describes; None if any of it is not as written."""
    try:
        meta, sizes = kept["meta"], kept["meta_bytes"]
        last_seq, cursors, losses = kept["last_seq"], kept["cursors"], kept["losses"]
        finish, counted = kept["finish"], kept["after"]
        found = verified_in(kept) if verify else []
        if not (
            isinstance(meta, dict)
            and isinstance(sizes, dict)
            and as_count(last_seq) is not None
            and isinstance(cursors, dict)
            and all(as_count(v) is not None for v in cursors.values())
            and isinstance(losses, dict)
            and all(is_loss_record(v) for v in losses.values())
            and (finish is None or isinstance(finish, dict))
            and isinstance(found, list)
        ):
            return None
        damage = [Damage(seq, str(what), int(n)) for seq, what, n in found]
        if not all(d.seq is None or as_count(d.seq) is not None for d in damage):
            return None
        after = {int(at): _counter(counts) for at, counts in (counted or {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if meta_bounds is not None:
        most, shape = meta_bounds
        left_out = {k: n for k, v in meta.items() if (n := _size(k, v, sizes, most)) > most}
        meta = {k: shape(v) for k, v in meta.items() if k not in left_out}
        if left_out:
            meta[K_OVERSIZED] = left_out
    return JournalInfo(
        **{
            **base,
            "local_id": local_id_of(meta, base["path"]),
            "meta": meta,
            "last_seq": last_seq,
            "cursors": cursors,
            "losses": losses,
            "damage": damage,
            "after": after,
            "finish": finish,
        }
    )


def _counter(counts: dict[str, Any]) -> Counter[int]:
    """A summary's counts of one cursor (``{"kind": n}``, each ``n`` a
    count: ``as_count``) as a Counter; TypeError or ValueError for anything
    else (``int(n)`` took 2.5 as 2, "7" as 7 and -5 as it is, each listed
    as a tally). Filled as a dict: a listing makes thousands, and
    ``Counter(mapping)`` goes through ``update``'s checks in Python (a tenth
    of a listing's reading of its summaries)."""
    made: Counter[int] = Counter()
    dict.update(made, {int(kind): _count(n) for kind, n in counts.items()})
    return made


def _count(value: Any) -> int:
    """``value`` if it is a count (``as_count``); ValueError otherwise."""
    if type(value) is not int or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


#: Meta values up to this size (encoded) are not sized in a summary: a
#: bounded reader allows far more (the dashboard 1 MiB), and most are a few bytes.
_SMALL_META = 1024


def _size(key: str, value: Any, sizes: dict[str, Any], most: int) -> int:
    """A meta value's size as the journal holds it (its canonical JSON), from
    the summary where it is large; measured only for a bound below that."""
    size = sizes.get(key)
    if isinstance(size, int):
        return size
    return len(dumps(value)) if most < _SMALL_META else 0
