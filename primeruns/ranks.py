"""Several processes attached to one run (ranks): which one is its primary,
and the primary's wait for the others before it closes the run.

torchrun, SLURM and their kin start N processes that each call
``init(kind="train", id=RUN_ID)``. Each journals into a directory of its own
(one writer per journal) attached to the same platform run, and each ships
its own. Only one of them, the *primary*, closes the run: the others'
``finish()``, their uplinks' close-out after a crash, and ``replay`` or
``sync`` of their journals ship their records and leave the run open
(``ship.lifecycle`` reads the role from the journal's meta, ``K_ROLE``).

Which process is the primary (``resolve_role``), the first rule that applies:

1. ``init(primary=True)`` or ``init(primary=False)``;
2. ``PRIME_RUNS_PRIMARY=1`` or ``0`` in the environment;
3. a run ``init()`` creates (no ``id=``, no ``run_key=``): its creator;
4. the launcher's rank: ``RANK`` (torchrun, accelerate, DeepSpeed), else
   ``SLURM_PROCID`` (srun): rank 0 is the primary, unless the run's creator
   lives on this host (it holds the run's lock, rule 5: the creator is the
   primary; rank 0 keeps its rank). A rank held by another
   living process of this host that attached the run is inherited, not
   given (processes spawned by one srun task share its ``SLURM_PROCID``):
   such a process has no rank and is not the primary. A variable's value
   that is no rank (not ASCII digits, or more than 9) is read as none, the
   next variable read, and said once with its fix: in silence, a launcher's
   rank process took the part of one without a rank;
5. otherwise the first process on this host to attach the run: it holds a
   lock named for the run (for a run key, for the key on its platform,
   ``_key_of``: each of its processes registers the key's run as a creator
   would) in the runs directory for as long as it lives
   (the run's creator takes that lock too once the run is registered,
   ``claim_created``: a process attaching to it later is not a primary).

The lock files (``<runs dir>/.primary/``) matter only while held: ``primeruns
gc`` deletes those no living process holds (``collect_locks``), holding the
folder's own lock while it does. An attacher that finds a lock held looks
again under that folder's lock (gc takes a free one for a moment to prove it
free), and one whose file lost its name before it locked it takes the file
the path names (``_take``). Nothing here lists the folder. A lock is taken
and recorded while forks wait (``journal.lock.forks_wait``): a child forked
by another thread meanwhile closes its copy, as it closes the others.

The primary closes the run only after the other processes of the run whose
journals are in its runs directory (its host's ranks, and the children they
forked) are done: each one's producer and uplink gone, their records shipped
(``wait_for_others``, from the uplink's close-out). The wait is bounded by
the close-out's deadline and by the stall rule (nothing of theirs moved for
``stall_s``); what was left is recorded with the close-out and said by
``finish()``. Ranks on other hosts cannot be seen from here: the launcher
makes them finish first (a barrier before the primary's ``finish()``,
README "Ranks").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primeruns.logs import get_logger

from . import run_index
from .ascii_digits import decimal_or_none
from .exceptions import JournalError
from .journal import JournalInfo, journal_info, list_journals
from .journal.lock import forks_wait, lock_held, plain_files, read_owner, remove_unheld
from .journal.origin import Origin
from .journal.store import DATA_NAME
from .journal.trust import check_dir, make_private_dirs
from .redaction import scrub
from .settings import parse_bool_setting
from .ship.standby import pause
from .spec import SPEC_KEY, listed_spec

if TYPE_CHECKING:
    from .journal.journal import Journal

__all__ = [
    "BEING_SHIPPED",
    "K_ROLE",
    "Role",
    "claim_created",
    "collect_locks",
    "is_primary",
    "launcher_rank",
    "others_of",
    "primary_from_env",
    "resolve_role",
    "shipped_through_sync",
    "wait_for_others",
]

log = get_logger("primeruns")

# Journal meta: {"primary": bool, "label": str} (absent: a primary, as every
# journal before ranks were known).
K_ROLE = "role"
PRIMARY_ENV = "PRIME_RUNS_PRIMARY"
# The launchers' rank variables, most specific first: torchrun's global rank
# wins over SLURM's task id (srun starting one torchrun per node sets both).
_RANK_ENVS = ("RANK", "SLURM_PROCID")
# Past any rank a launcher gives (a billion processes).
_RANK_DIGITS = 9
# The rank variables' values warned of (``_say_unreadable``): once per process.
_warned_ranks: set[tuple[str, str]] = set()
_LOCKS_DIR = ".primary"
_LOCK_SUFFIX = ".lock"
# A lock file gc deletes as it is taken is taken again at most this often.
_TAKE_TRIES = 5
# The primary looks at the others' journals this often while it waits (a wait
# on other processes' files: nothing here can wake it).
_POLL_S = 0.1
# How ``wait_for_others`` begins the reason of a journal another process
# ships on (nothing for the user to do, unless that process stops).
BEING_SHIPPED = "being shipped by "
# The commands that ship a journal through its sync journal.
_SHIPPING_COMMANDS = frozenset({"sync", "replay"})

# Locks this process holds as the first attacher of a run, or as a launcher's
# rank: kept open while the journal of the handle they made primary is in
# use, and let go at a later attach once nobody uses it (``_let_go_of_done``;
# the process's exit releases the rest; a forked child closes its copies,
# ``_after_fork_in_child``).
# Per run id: the lock's descriptor, and the journal of the handle it made primary.
_held: dict[str, tuple[int, Path]] = {}


@dataclass(frozen=True)
class Role:
    """This process's place among the processes of its run."""

    primary: bool
    label: str
    """Names this process's keys where two processes logged one key for one
    step with different values (``sinks.step_rows``): ``rank<N>`` when the
    launcher gave a rank, else the journal's local id."""
    rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"primary": self.primary, "label": self.label}
        if self.rank is not None:
            out["rank"] = self.rank
        return out

    @classmethod
    def of(cls, journal: Journal) -> Role | None:
        """The role recorded in ``journal``'s meta (None: none recorded)."""
        return cls.from_json(journal.get_meta(K_ROLE))

    @classmethod
    def from_json(cls, value: Any) -> Role | None:
        if not isinstance(value, dict) or not isinstance(value.get("label"), str):
            return None
        rank = value.get("rank")
        return cls(
            primary=value.get("primary") is not False,
            label=value["label"],
            rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        )


def is_primary(journal: Journal) -> bool:
    """Whether ``journal``'s process may close its run (a journal without a role may)."""
    role = Role.of(journal)
    return role is None or role.primary


def launcher_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """The rank the launcher gave this process, if any. A value that is not
    a non-negative integer of at most ``_RANK_DIGITS`` digits is no rank:
    the next variable is read, and a warning (once per value) names it."""
    env = os.environ if environ is None else environ
    unreadable: list[tuple[str, str]] = []
    for name in _RANK_ENVS:
        raw = env.get(name, "").strip()
        rank = decimal_or_none(raw, _RANK_DIGITS)
        if rank is not None:
            _say_unreadable(unreadable, f"{name}={rank} is taken instead")
            return rank
        if raw:
            unreadable.append((name, raw))
    _say_unreadable(
        unreadable,
        "this process has no rank (not the primary, unless it is the first on this host "
        "to attach the run)",
    )
    return None


def _say_unreadable(unreadable: list[tuple[str, str]], taken: str) -> None:
    """Warn once per process of each rank variable's value in ``unreadable``:
    read as no rank in silence, a rank process took a part not its own
    (without a rank, the first process on this host to attach the run is its
    primary, whatever the launcher meant) and nobody said why."""
    for name, raw in unreadable:
        if (name, raw) in _warned_ranks:
            continue
        _warned_ranks.add((name, raw))
        problem = (
            f"has {len(raw)} digits, more than any rank (at most {_RANK_DIGITS})"
            if raw.isascii() and raw.isdigit()
            else "is not a rank (a non-negative integer in ASCII digits)"
        )
        log.warning(
            "prime-runs: %s=%s %s: %s. Set %s to this process's rank (0 for the run's "
            "primary), or unset it.",
            name,
            # Scrubbed whole, then cut: a key pasted into the variable
            # (``RANK=$PRIME_API_KEY``) was logged as it was.
            scrub(repr(raw))[:80],
            problem,
            taken,
            name,
        )


def primary_from_env(environ: Mapping[str, str] | None = None) -> bool | None:
    """``PRIME_RUNS_PRIMARY`` (None: not set); ``ConfigurationError`` for a
    value that is not a boolean."""
    env = os.environ if environ is None else environ
    return parse_bool_setting(PRIMARY_ENV, env.get(PRIMARY_ENV, ""))


def resolve_role(
    primary: bool | None,
    *,
    attach_id: str | None,
    runs_dir: Path,
    local_id: str,
    run_key: str | None = None,
    api_root: str = "",
    environ: Mapping[str, str] | None = None,
) -> Role:
    """This process's role (module doc: the rules in order). Raises
    ``ConfigurationError`` for a ``PRIME_RUNS_PRIMARY`` that is not a boolean."""
    env = os.environ if environ is None else environ
    rank = launcher_rank(env)
    # The run is attached by id, or named by a run key on ``api_root``: its
    # processes on this host meet at a lock named for it (rules 4 and 5).
    attach_id = attach_id if attach_id is not None or not run_key else _key_of(run_key, api_root)
    inherited = False
    if rank is not None and attach_id is not None:
        inherited = _held_by_another(Path(runs_dir), _rank_key(attach_id, rank), local_id)
    label = f"rank{rank}" if rank is not None and not inherited else local_id
    if primary is None:
        primary = primary_from_env(env)
    if primary is None:
        if attach_id is None:
            primary = True
        elif rank is not None:
            # Not while the run's creator (or its primary of rule 5) lives on
            # this host: it holds the run's lock (``claim_created``), and a
            # second primary's finish() closed the run while it still logged.
            # A later handle of this process keeps what its first had.
            primary = (
                rank == 0
                and not inherited
                and (attach_id in _held or _first_to_attach(Path(runs_dir), attach_id, local_id))
            )
        else:
            primary = _first_to_attach(Path(runs_dir), attach_id, local_id)
    return Role(primary=primary, label=label, rank=None if inherited else rank)


def _key_of(run_key: str, api_root: str) -> str:
    """The name a run key's processes take the run's lock under (rule 5),
    one per platform as the key's run is (``ship.run_keys``), apart from
    any run id's. Each process of a key registers the key's run as if it
    created it, yet only the first of those on this host is its creator
    here: as creators all, N processes of one key started at once were N
    primaries, each one's close-out waiting for the others' journals (held
    while they waited too) until the stall rule or its deadline, and the
    first to give up closed the run while the others still shipped."""
    return f"run_key\0{api_root}\0{run_key}"


def _held_by_another(runs_dir: Path, key: str, local_id: str) -> bool:
    """Whether another living process of this host holds the rank lock
    ``key``. This process keeps a rank it took for its later handles (a job
    attaching the run again for a second phase while the first phase's
    uplink still ships)."""
    return key not in _held and not _first_to_attach(runs_dir, key, local_id)


def _after_fork_in_child() -> None:
    """Run by ``hooks``' after-fork handler: a forked child holds none of
    its parent's locks (closing its copy of each leaves the parent's hold).
    Kept, a worker of a dead rank 0 (a data loader's, still alive) would
    hold its rank and the run's lock, and rank 0 restarted would be nobody's
    primary."""
    for fd, _ in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


def _rank_key(run_id: str, rank: int) -> str:
    """The lock the process holding launcher rank ``rank`` of run ``run_id``
    on this host takes: a rank variable is inherited by every process its
    holder starts (``torch.multiprocessing.spawn`` in an sbatch script: all
    of them ``SLURM_PROCID=0``), and only the first of those to attach is
    that rank. The others get no rank: neither the primary nor its label and
    sample id ranges (their keys of a step, their Parquet rows' sample ids,
    would collide with the rank's)."""
    return f"{run_id}#rank{rank}"


def claim_created(runs_dir: Path, run_id: str, local_id: str) -> None:
    """The process that created run ``run_id`` (its primary, rule 3) holds
    the run's lock too, once the run's id is known: a process of this host
    that attaches to the run later by id (rule 5, no rank given) is then not
    a second primary, whose ``finish()`` would close the run while its
    creator still logs into it."""
    _first_to_attach(Path(runs_dir), run_id, local_id)


def _first_to_attach(runs_dir: Path, run_id: str, local_id: str) -> bool:
    """Take the run's lock in the runs directory if no living process holds
    it: True for the first process to attach the run, and again for one that
    attaches after that process ended (a requeued job)."""
    with forks_wait():  # (init() in several threads: one look at _held at a time)
        _let_go_of_done(keep=run_id)
        held = _held.get(run_id)
        if held is not None:
            # This process attached the run before: that handle stays the
            # primary while its journal is in use (its producer's or uplink's).
            fd, earlier = held
            if lock_held(earlier):
                return False
            _held[run_id] = (fd, runs_dir / local_id)
            return True
    import hashlib  # here: OpenSSL's start-up (~10 ms) is no listing's, which imports this module

    digest = hashlib.sha256(run_id.encode()).hexdigest()[:32]
    folder = Path(runs_dir) / _LOCKS_DIR
    path = folder / f"{digest}{_LOCK_SUFFIX}"
    try:
        make_private_dirs(folder)
        check_dir(folder, "primary lock folder")  # never a symlink, never another's
        # Taken and recorded before a fork by another thread (a pool's
        # worker handler) copies it: the child closes those in ``_held``.
        with forks_wait():
            taken = _take(path)
            if taken is None:
                # Held; or gc held it a moment to see whether it may delete it
                # (``collect_locks``), which it does holding the folder's lock:
                # looked at again once gc is not at it.
                with _folder_locked(folder, fcntl.LOCK_SH):
                    taken = _take(path)
            if taken is not None:
                _held[run_id] = (taken, runs_dir / local_id)
    except (OSError, JournalError) as exc:
        # No lock to take (a read-only runs dir, an untrusted folder): behave
        # as the only process.
        log.info("prime-runs: could not take the run's primary lock: %s", exc)
        return True
    return taken is not None


def _let_go_of_done(keep: str) -> None:
    """Close the locks held for journals nobody uses any longer (their runs
    finished and shipped: no producer or uplink holds them), but ``keep``'s,
    which the caller looks at itself. Kept for the process's life, a process
    opening run after run (an evaluation per epoch of a training) held one
    descriptor per run it had made, until its opens failed (EMFILE). A run
    attached again after its lock was let go takes it again if no other
    process did meanwhile: the first to attach, as after a requeue."""
    with forks_wait():  # no fork copies a descriptor as it is closed
        for key, (fd, journal) in list(_held.items()):
            if key == keep or lock_held(journal):
                continue
            del _held[key]
            with contextlib.suppress(OSError):
                os.close(fd)


def _take(path: Path) -> int | None:
    """The lock file at ``path``, locked exclusively if no process holds it
    (None: one does). A file gc deleted between its open and its lock is
    nobody's lock (a process opening the path makes a new one): the file the
    path names is taken instead."""
    for _ in range(_TAKE_TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                return fd
        except FileNotFoundError:
            pass  # deleted after the lock was taken: open the path again
        os.close(fd)
    raise OSError(f"the lock file {path} was deleted each time it was taken")


@contextlib.contextmanager
def _folder_locked(folder: Path, how: int) -> Iterator[None]:
    """The lock folder's own ``flock`` held (``how``): gc holds it exclusively
    while it deletes lock files, an attacher shared to look again at a lock
    it found held."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


def collect_locks(runs_dir: Path, *, dry_run: bool) -> list[Path]:
    """For ``primeruns gc``: delete the lock files in ``runs_dir`` no living
    process holds (the lock of a run or rank matters only while held: a later
    attacher makes it anew). Those deleted (would be, with ``dry_run``)."""
    folder = Path(runs_dir) / _LOCKS_DIR
    try:
        check_dir(folder, "primary lock folder")
        files = plain_files(folder, _LOCK_SUFFIX)
    except (OSError, JournalError):
        return []
    return [path for path in files if _remove_free(path, dry_run=dry_run)]


def _remove_free(path: Path, *, dry_run: bool) -> bool:
    """Delete the lock file at ``path`` if no process holds it, holding the
    folder's lock the while (a moment: an attacher that found the file held
    meanwhile looks again after). False: held, or an attacher is looking at
    the folder (the next gc deletes it)."""
    try:
        with _folder_locked(path.parent, fcntl.LOCK_EX | fcntl.LOCK_NB):
            return remove_unheld(path, dry_run=dry_run)
    except BlockingIOError:  # (the folder's lock; any other error is gc's to say)
        return False


# -- the primary's wait ----------------------------------------------------------------


def written_in(journal: Journal) -> tuple[Path, Path]:
    """(the runs directory ``journal`` was written in, its path there): for a
    sync journal (``primeruns replay``, ``sync``), its original's, where the
    run's other processes on this host keep theirs; else its own."""
    from .ship.mirror import K_SOURCE_ORIGIN

    origin = Origin.from_json(journal.get_meta(K_SOURCE_ORIGIN))
    if origin is not None and origin.on_this_host:
        original = Path(origin.path)
        if original.parent.is_dir():
            return original.parent, original
    return journal.path.parent, journal.path


def others_of(journal: Journal, run_id: str, *, own_children: bool) -> list[Path]:
    """The journals of other processes logging to platform run ``run_id`` in
    the runs directory ``journal`` was written in: attached to it or bound to
    it, and not taken over by a later process (``continued_by``). Forked
    children are among them (a rank killed out of memory while a data
    loader's worker of its own logs on never ran the finish that waits for
    them), but for ``journal``'s own, which its finish waited for
    (``forkchild``), unless ``own_children``: its producer died unfinished.

    A run this journal created (not attached by id, no run key shared with
    other jobs' journals) can have been attached to only after it was
    registered, so only journals made since this one are looked at: every
    run's close-out would otherwise read every past run of the runs
    directory (a one-episode evaluation's finish spent most of its time
    there with a few dozen). Any other run's journals are found by the
    index of the runs directory by run (``run_index``), for the same reason."""
    from .ship.lifecycle import K_FORK_PARENT

    runs_dir, original = written_in(journal)
    mine = listed_spec({SPEC_KEY: journal.get_meta(SPEC_KEY)})
    created_here = mine is not None and not mine.attach_id and not mine.run_key
    found = []
    skip = [journal.path, original]
    if created_here:
        listed = list_journals(runs_dir, skip=skip, since=original.name)
    else:  # its ranks may have attached before it: the run's journals, by the index
        listed = run_index.journals_of(runs_dir, run_id, skip=skip)
    for info in listed:
        meta = info.meta
        if run_id not in run_index.runs_of(info):
            continue
        if meta.get("continued_by"):
            continue
        if not own_children and meta.get(K_FORK_PARENT) == original.name:
            continue
        found.append(info.path)
    return found


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a journal moves: its files' sizes and times."""
    out = []
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                out.append((entry.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def _left_in(path: Path) -> str | None:
    """What a journal whose processes are gone left unshipped, or None:
    shipped by its uplink, or through its sync journal (by ``replay``,
    ``sync``, or a requeued job's uplink that took it over: a copy is never
    written, so its own state never says shipped), or by one that was
    pruned (its record says so)."""
    from .ship.mirror import sync_root

    try:
        info = journal_info(path)
    except (JournalError, OSError) as exc:
        return f"could not be read ({exc})"
    if info.meta.get("state") == "shipped":
        return None
    try:
        root = sync_root()
        if shipped_through_sync(info, root):
            return None
        shipper = _shipping_it(path, info.meta, info.last_seq, root)
    except JournalError as exc:  # an untrusted sync root: its records are not read
        return f"not shipped: its processes are gone ({exc})"
    if shipper is not None:
        return f"{BEING_SHIPPED}{shipper}, which ships the rest"
    return "not shipped: its processes are gone"


def shipped_through_sync(info: JournalInfo, root: Path) -> bool:
    """Whether the listed journal ``info`` shipped all it holds through its
    sync journal under ``root`` (``replay``, ``sync``, or a requeued job's
    uplink that took it over), or through one since pruned (its record says
    so). Raises JournalError for an untrusted sync root.

    A record speaks only for a sync journal that is gone (``gc`` prunes one
    only once it shipped everything): while it is there, it answers itself.
    The record says whether the run is closed, and a ``replay`` that closed
    it (or found it closed) with records left to ship says so too; taken at
    its word, a requeue passed over a journal whose sync journal still held
    them, and nothing else shipped them."""
    from .ship.copies import check_sync_root, sync_path
    from .ship.sync_records import nothing_new

    check_sync_root(root)
    mine = sync_path(info.path, info.meta, root)
    if mine is not None and (mine / DATA_NAME).exists():
        return _shipped_through_sync_journal(info.path, info.meta, info.last_seq, root)
    return nothing_new(root, info.local_id, info.last_seq)


def _shipping_it(path: Path, meta: Mapping[str, Any], last_seq: int, root: Path) -> str | None:
    """Who ships the journal at ``path`` (ending at ``last_seq``) through
    its sync journal now, or None: a ``primeruns sync`` or ``replay`` of a
    copy on the login node holds the sync journal, which imported all of it
    (a sync of a copy taken earlier ships none of what came after)."""
    from .ship.copies import K_SOURCE_PATH, sync_path

    mine = sync_path(path, meta, root)
    if mine is None or mine.absolute() == path.absolute() or not lock_held(mine):
        return None
    owner = read_owner(mine)
    if owner is None or owner.command not in _SHIPPING_COMMANDS:
        return None  # (``gc`` deleting it, or a process that does not say)
    try:
        source = journal_info(mine).meta.get(K_SOURCE_PATH)
    except (JournalError, OSError):
        return None
    upto = source.get("imported_upto") if isinstance(source, dict) else None
    if not isinstance(upto, int) or isinstance(upto, bool) or upto < last_seq:
        return None
    return owner.describe()


def _shipped_through_sync_journal(
    path: Path, meta: Mapping[str, Any], last_seq: int, root: Path
) -> bool:
    """Whether the sync journal of the journal at ``path`` (ending at
    ``last_seq``) imported all of it and shipped everything it holds."""
    from .ship.copies import K_SOURCE_PATH, check_sync_root, sync_path

    check_sync_root(root)
    mine = sync_path(path, meta, root)
    if mine is None or mine.absolute() == path.absolute() or not (mine / DATA_NAME).exists():
        return False
    try:
        sync = journal_info(mine)
    except (JournalError, OSError):
        return False
    source = sync.meta.get(K_SOURCE_PATH)
    upto = source.get("imported_upto") if isinstance(source, dict) else None
    return (
        sync.meta.get("state") == "shipped"
        and isinstance(upto, int)
        and not isinstance(upto, bool)
        and last_seq <= upto
    )


def wait_for_others(others: list[Path], *, deadline: float, stall_s: float) -> dict[str, str]:
    """Wait until each journal of ``others`` is let go by its producer and
    uplink (its owner lock free), until ``deadline`` (monotonic), or until
    none of those still held moved for ``stall_s``. Per journal left behind,
    why (its path to ship it with ``primeruns replay``)."""
    waiting = list(others)
    moved_at = time.monotonic()
    seen = {p: _signature(p) for p in waiting}
    while waiting:
        waiting = [p for p in waiting if lock_held(p)]
        if not waiting:
            break
        now = time.monotonic()
        for path in waiting:
            signature = _signature(path)
            if signature != seen[path]:
                seen[path], moved_at = signature, now
        if now >= deadline or now - moved_at >= stall_s:
            break
        pause(_POLL_S)
    left: dict[str, str] = {}
    for path in others:
        if path in waiting:
            left[str(path)] = "still logging or shipping when the run was closed"
            continue
        why = _left_in(path)
        if why is not None:
            left[str(path)] = why
    return left
