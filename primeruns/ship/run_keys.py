"""Run keys: the platform run a user's key names, remembered where runs are synced.

A job requeued offline (a scheduler's preemption, a node failure) writes a
new journal on another node for the same logical run. ``init(run_key=K)``
names that run; ``primeruns sync`` of each journal with ``K`` must land in
one platform run. The first journal to register creates the run and records
it here; the others find it and ship into it. The first to close the run
records how (``note_closed``): the platform keeps a run's first close, so
the others, synced later, close nothing and say how it was closed.

An evaluation is also found on the platform itself (its create carries the
key as its client token, and evaluations can be listed), so this record is a
shortcut there; an external training run cannot be looked up on the wire, so
for training runs this record is the only way: sync the journals of one key
where the record is (one login node, one user), which is how a runs directory
is synced anyway. A record names the run a key's records go to: it is read
and written only in a sync root of the user's own (``copies.check_sync_root``),
never through a link.

A key is recorded per platform (API root): the same key on a local platform
and on the real one names two runs. Registration holds the key's lock, so
two syncs of one key at once never create it twice.

Until a create succeeds, the record counts the key's training creates whose
answers were lost (``creates_lost``, ``lost_creates``): each may have made
an empty run no lookup finds. A process bounds its own lost creates, but N
ranks of one key behind a gateway losing every answer each took the lock in
turn, found no run named and created again: up to 4N empty runs for the one
run asked for. Counted per key, the bound holds whatever N is; a count whose
last lost create is older than ``LOST_WINDOW_S`` is spent no more (a job
requeued later, or a replay once the gateway is fixed, may create again):
older on the host's boot clock when the record was written on this boot (a
wall clock stepped forward freed the key's creates at once), else on the
wall clock.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..exceptions import RetryableAPIError
from ..jsonbound import finite_number
from ..settings import default_sync_root as sync_root
from .copies import make_sync_root, read_record
from .deadline import boot_clock
from .standby import pause

__all__ = [
    "CREATES_ALLOWED",
    "LOST_WINDOW_S",
    "closed_as",
    "count_lost_create",
    "held",
    "lookup",
    "lost_creates",
    "lost_creates_until",
    "lost_creates_window",
    "note_closed",
    "remember",
]


_FOLDER = "run-keys"


def _path(key: str, api_root: str, root: Path | None) -> tuple[Path, Path]:
    """(the sync root, the key's record in it)."""
    digest = hashlib.sha256(f"{api_root}\n{key}".encode()).hexdigest()
    root = root or sync_root()
    return root, root / _FOLDER / f"{digest}.json"


# How often a bounded wait for a key's lock tries it again.
_LOCK_LOOK_S = 0.05


@contextlib.contextmanager
def held(
    key: str, api_root: str, root: Path | None = None, *, until: float | None = None
) -> Iterator[None]:
    """Hold the key's lock (blocking) while a run is looked up and created.
    ``until`` (monotonic): give up then, with a transient failure (another
    process is registering the key's run, which may take minutes against a
    platform that does not answer: ``init()``'s registration is bounded)."""
    root, path = _path(key, api_root, root)
    make_sync_root(root, _FOLDER)
    fd = os.open(
        path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
    )
    try:
        _lock(fd, key, until)
        yield
    finally:
        os.close(fd)


def _lock(fd: int, key: str, until: float | None) -> None:
    if until is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= until:
                raise RetryableAPIError(
                    f"another process is registering the run of run key {key!r}"
                ) from None
            pause(_LOCK_LOOK_S)


def _record(key: str, api_root: str, root: Path | None) -> dict[str, Any] | None:
    root, path = _path(key, api_root, root)
    found = read_record(root, _FOLDER, path.name, limit=1 << 16)
    return found if isinstance(found, dict) else None


def lookup(key: str, api_root: str, root: Path | None = None) -> dict[str, Any] | None:
    """The run recorded for ``key`` (``run_id``, ``kind``, ``url``, ``name``), or None."""
    found = _record(key, api_root, root)
    if found is None or not isinstance(found.get("run_id"), str):
        return None
    return found


# A run key's lost creates within the window before a process sends no
# more: a key's record never counts more (none is sent once it holds these).
CREATES_ALLOWED = 3
# How long the key's lost creates count against a create of its run: the
# ranks of one job start within it, a requeue or a replay after it may try anew.
LOST_WINDOW_S = 600.0
_LOST = "creates_lost"
_LOST_AT = "lost_at"
_EARLIER_AT = "earlier_lost_at"  # lost_at before the create in flight
# The same instants on the host's boot clock, and that boot's id: the wall
# clock steps (NTP, a VM resumed), and one stepped forward past the window
# freed the key's creates at once. The boot clock never steps, and processes
# of one boot share it; a record of another boot (a reboot, another host
# sharing the sync root) is read on the wall clock, as one without them.
_AT_BOOT = "lost_at_boot"
_EARLIER_AT_BOOT = "earlier_lost_at_boot"
_BOOT_ID = "boot_id"
_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def _boot_id() -> str | None:
    """This host's boot (Linux), or None where none can be read."""
    try:
        return _BOOT_ID_FILE.read_text(encoding="ascii").strip() or None
    except (OSError, ValueError):
        return None


def _stamp(value: object) -> float | None:
    """A record's date as a float, or None for one no clock can have stamped
    (not a number, NaN or infinite, an int past a float: the sync root is
    untrusted input, and NaN compares false, so it never left the window)."""
    return finite_number(value)


def _since_on_boot(found: dict[str, Any], field: str) -> float | None:
    """Seconds since the record's boot-clock stamp ``field``, if it was
    written on this boot and is one the clock has passed, else None."""
    stamp, boot = _stamp(found.get(field)), found.get(_BOOT_ID)
    if boot is None or boot != _boot_id() or stamp is None:
        return None
    since = boot_clock() - stamp
    return since if since >= 0 else None  # ahead of the clock: damage, read on the wall


def lost_creates(key: str, api_root: str, root: Path | None = None) -> int:
    """How many creates of ``key``'s run, by any process, may have made a run
    with their answers lost, the last within ``LOST_WINDOW_S`` (of now, before
    or after on the wall clock, which steps; on the boot clock for a record
    of this boot); 0 once a run is recorded. Read under the
    key's lock (``held``) to spend one; read outside it only to say how many
    runs may remain (``remember`` writes the record whole, so such a read
    sees one count or the other)."""
    return lost_creates_until(key, api_root, root)[0]


def lost_creates_until(
    key: str, api_root: str, root: Path | None = None
) -> tuple[int, float | None]:
    """``lost_creates`` and the wall time they stop counting (None at 0): a
    process refused a create says when one may be tried again."""
    count, until, _ = lost_creates_window(key, api_root, root)
    return count, until


def lost_creates_window(
    key: str, api_root: str, root: Path | None = None
) -> tuple[int, float | None, float]:
    """``lost_creates_until`` and the seconds left until they stop counting,
    on the clock that counts them (0.0 at 0). A process waiting for the
    window waits that long: the wall time named may be the stamped one, up
    to a second off the boot clock's end, and one woken before it ends is
    refused again."""
    found = _record(key, api_root, root)
    if found is None or isinstance(found.get("run_id"), str):
        return 0, None, 0.0
    count, at = found.get(_LOST), _stamp(found.get(_LOST_AT))
    if type(count) is not int or at is None or count <= 0:
        return 0, None, 0.0
    now = time.time()
    until = at + LOST_WINDOW_S
    left = until - now
    since = _since_on_boot(found, _AT_BOOT)
    if since is not None:  # this boot's: the window is counted on its clock
        if since >= LOST_WINDOW_S:
            return 0, None, 0.0
        # The wall time it ends, as stamped; as the boot clock counts when
        # the wall clock stepped since (more than a read's slack apart).
        left = LOST_WINDOW_S - since
        ends = now + left
        until = until if abs(until - ends) < 1.0 else ends
    # Within the window either way on the wall clock: one dated further
    # ahead (the clock stepped back since, a damaged or planted record,
    # Infinity) would lock the key out until the clock caught up, or for good.
    elif abs(now - at) >= LOST_WINDOW_S:
        return 0, None, 0.0
    # More than a key can count is damage (or planted): still spent, but
    # quoted as "up to 10**50 empty runs may remain" it was no count at all.
    return min(count, CREATES_ALLOWED), until, left


def count_lost_create(key: str, api_root: str, delta: int, root: Path | None = None) -> None:
    """Count a create of ``key``'s run as lost (``delta`` 1: before its request,
    so a process killed waiting for the answer leaves it counted), or take
    that back (-1: it was refused as a whole, or never sent). Under the key's
    lock (``held``); a recorded run is left alone."""
    if lookup(key, api_root, root) is not None:
        return
    count, until = lost_creates_until(key, api_root, root)
    found = _record(key, api_root, root) or {}
    record: dict[str, Any]
    if delta > 0:
        # The date of the earlier ones, for a take-back to restore: a create
        # that made no run must not carry their window on from its own time.
        earlier = None if until is None else until - LOST_WINDOW_S
        on_boot = until is not None and _since_on_boot(found, _AT_BOOT) is not None
        earlier_boot = found.get(_AT_BOOT) if on_boot else None  # (this boot's only)
        record = {_LOST: count + delta, _LOST_AT: time.time(), _EARLIER_AT: earlier}
        record |= {_AT_BOOT: boot_clock(), _EARLIER_AT_BOOT: earlier_boot, _BOOT_ID: _boot_id()}
    else:
        earlier = _stamp(found.get(_EARLIER_AT))
        at = earlier if earlier is not None else time.time()
        record = {_LOST: max(0, count + delta), _LOST_AT: at}
        if found.get(_EARLIER_AT_BOOT) is not None:  # of the boot it names, as written
            record |= {_AT_BOOT: found[_EARLIER_AT_BOOT], _BOOT_ID: found.get(_BOOT_ID)}
    # Not synced: a killed process's write survives it in the page cache,
    # and a host crash that loses it (or leaves the record empty, which
    # reads as no count) costs at most one more create; a synced count cost
    # every keyed training create a second fsync on init()'s path.
    remember(key, api_root, record, root, durable=False)


def remember(
    key: str,
    api_root: str,
    binding: dict[str, Any],
    root: Path | None = None,
    *,
    durable: bool = True,
) -> None:
    """Record the run ``key`` names (atomically: a reader sees all or nothing;
    ``durable``: synced before it replaces the last, to outlive a host crash)."""
    root, path = _path(key, api_root, root)
    make_sync_root(root, _FOLDER)
    temp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"key": key, **binding}, handle)
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    os.replace(temp, path)


def closed_as(key: str, api_root: str, run_id: str, root: Path | None = None) -> str | None:
    """The status a journal of ``key`` closed its run ``run_id`` with, if one did."""
    found = lookup(key, api_root, root)
    if found is None or found["run_id"] != run_id:
        return None
    status = found.get("closed_as")
    return status if isinstance(status, str) else None


def note_closed(
    key: str, api_root: str, run_id: str, status: str, root: Path | None = None
) -> None:
    """Record that a journal of ``key`` closed its run ``run_id`` with ``status``
    (the first close only: the platform keeps that one)."""
    with held(key, api_root, root):
        found = lookup(key, api_root, root)
        if found is not None and found["run_id"] == run_id and "closed_as" not in found:
            remember(key, api_root, {**found, "closed_as": status}, root)
