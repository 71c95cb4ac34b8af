"""How a run ends, seen from the producer: the finish entry, the wait, the words.

``finish()`` (and the exit and SIGTERM hooks) come here once the status is
decided. The finish entry is journaled first: from then on the run's end is
on disk, whatever happens to this process, and the uplink drains up to it
and closes the run out with its status. This module then waits for that
close-out (online), and says in one warning what was left behind and the
command that ships it. Offline, the journal is simply closed: ``primeruns
sync`` registers and ships it later.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from primeruns.logs import get_logger

from . import ranks, records
from .exceptions import JournalError
from .journal import EntryKind, Journal, in_memory
from .journal.listing import keep_summary
from .models import RunStatus
from .recorder import Recorder
from .ship import ledger
from .ship.deadline import K_AT_BOOT, boot_clock
from .ship.ledger import Closeout
from .spec import SPEC_KEY, journal_spec
from .supervisor import Supervisor

__all__ = [
    "ending_of",
    "finish_journal",
    "settle",
    "store_edited_config",
    "terminal",
    "warn_unfinished",
]

log = get_logger("primeruns")

# The most of the finish's time spent waiting for records held for a full
# disk to be journaled (``finish_journal``); the rest is the close-out's.
_HELD_SHARE = 0.5


def terminal(status: RunStatus | str) -> RunStatus:
    """``finish(status=...)`` checked: a terminal status, or ValueError naming the choices."""
    try:
        final = RunStatus(status)
    except ValueError:
        raise ValueError(
            f"finish: status must be one of completed, failed, cancelled, crashed; got {status!r}"
        ) from None
    if final is RunStatus.RUNNING:
        raise ValueError("finish: status 'running' is not a terminal status")
    return final


def ending_of(exc: BaseException | None) -> tuple[RunStatus, BaseException | str | None]:
    """How a ``with run:`` block ended: completed, cancelled by an interrupt,
    or failed with the exception that left it."""
    import asyncio

    if exc is None:
        return RunStatus.COMPLETED, None
    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
        return RunStatus.CANCELLED, "interrupted"
    return RunStatus.FAILED, exc


def warn_unfinished(supervisor: Supervisor, run_id: str, wait: float) -> None:
    log.warning(
        "prime-runs: run %s was not finished; closing it as crashed at exit, "
        "waiting up to %.0f s for %d unshipped record(s) (all are in the journal)",
        run_id,
        wait,
        sum(supervisor.pending().values()),
    )


def settle(
    recorder: Recorder,
    summary: Mapping[str, Any] | None,
    status: RunStatus,
    error: str | BaseException | None,
) -> str | None:
    """Merge the finish's summary into the run's, and say why the run ended:
    ``error`` as given, else (for a run that did not complete) the first
    failure noted, else None. Never raises: a field of the summary that
    cannot be journaled is left out, counted and said (under
    ``on_error="raise"``, raised once the run is closed)."""
    if summary is not None:
        rejected = recorder.merge_summary(summary, "summary", defer=True)
        recorder.drop_fields(rejected or (), defer=True)
    if error is not None:
        return _describe(error)
    if status is not RunStatus.COMPLETED and recorder.errors:
        return recorder.errors[0]
    return None


def store_edited_config(recorder: Recorder, config: dict[str, Any]) -> None:
    """An evaluation's ``config`` edited since ``init()``: the close-out sends
    it (the run's spec in the journal is what the uplink registers and closes
    the run with). Only for an evaluation the run created itself."""
    journal = recorder.journal
    assert journal is not None
    try:
        spec = journal_spec(journal)
    except JournalError as exc:  # SpecError is one
        recorder.note("config", exc)
        return
    if spec.config == config:  # as registered: nothing to store
        return
    edited = recorder.encodable(dict(config), "config")
    try:
        journal.set_meta(SPEC_KEY, replace(spec, config=edited).to_json())
    except (JournalError, TypeError, ValueError) as exc:
        recorder.note("config", exc)


def finish_journal(
    recorder: Recorder,
    supervisor: Supervisor | None,
    *,
    status: RunStatus,
    message: str | None,
    budget: float,
    wait: float | None,
    run_id: str,
) -> None:
    """Journal the finish entry, wait for the close-out (online), report, close.

    ``budget``: how long the uplink may ship before it closes the run out;
    ``wait``: how long this call waits for it (None: as long, plus a grace).
    """
    journal = recorder.journal
    assert journal is not None
    # Records held in memory for a full disk (``journal.overflow``) come
    # before the finish entry; they are waited for at most half the time
    # this call has, so the close-out keeps its share to ship them: waited
    # for the whole budget, they left it none (the uplink closed the run out
    # at once, hundreds of records unshipped). The entry is made once they
    # are in, its deadline counted from then, with what is left of the budget.
    started = time.monotonic()
    if supervisor is not None:
        # Only a shipping uplink frees the room they wait for: one that died
        # (killed alone) is replaced first, as the close-out's wait does,
        # else every held record waited out its share and was dropped.
        supervisor.replace_if_dead(restart=wait is not None)
    recorder.settle_held(
        (budget if wait is None else min(wait, budget)) * _HELD_SHARE,
        # Room comes only from the uplink's shipping (compaction follows its
        # acknowledgements): with every sink retired or paused none comes,
        # and the wait only took the close-out's time.
        None if supervisor is None else supervisor.may_free_room,
    )
    spent = time.monotonic() - started
    budget = max(0.0, budget - spent)
    wait = None if wait is None else max(0.0, wait - spent)
    record = {
        "status": status.value,
        "error": message,
        # The live summary may hold what the user put there since: only what encodes.
        "summary": recorder.clean_summary(defer=True),
        "at": time.time(),  # for people (show); deadlines never read the wall clock
        K_AT_BOOT: boot_clock(),
        "timeout": budget,  # the uplink's deadline: at_boot + timeout, on the boot clock
    }
    try:
        payload = records.encode_record(record, what="finish")
    except (TypeError, ValueError) as exc:  # the run closes whatever the summary holds
        recorder.note("summary", exc)
        payload = records.encode_record({**record, "summary": {}}, what="finish")
    recorder.append(EntryKind.FINISH, [payload], essential=True, final=True)
    recorder.count_held_lost()  # (one held meanwhile, by another thread, is lost with the finish)
    if supervisor is None:
        _close(recorder)
        return
    pending = supervisor.pending()
    if pending:
        log.info(
            "prime-runs: finishing run %s: shipping %d record(s) (%s), for up to %.0f s",
            run_id,
            sum(pending.values()),
            ", ".join(f"{k}: {v}" for k, v in pending.items()),
            budget,
        )
    waiting = budget if wait is None else min(wait, budget)
    outcome = supervisor.wait_closeout(waiting, grace=wait is None)
    journal = recorder.journal or journal  # re-created at the finish's append, maybe
    if recorder.kind == "eval":
        with recorder.lock:
            ledger.stamp_episodes_written(recorder.summary, journal)
    if in_memory(journal):
        _lose_unshipped(journal, outcome, run_id)
    else:
        _report(outcome, supervisor, run_id, str(journal.path), recorder)
    supervisor.release()
    _close(recorder)


def _close(recorder: Recorder) -> None:
    """Close the run's journal and keep its summary, so the next listing (the
    next run's close-out in a sweep, ``ls``) reads that instead of probing it."""
    journal = recorder.journal
    recorder.close()
    if journal is not None and not in_memory(journal):
        keep_summary(journal.path)


def _causes(recorder: Recorder) -> dict[str, str]:
    """Per sink, the latest failure the uplink recorded (for the words)."""
    return {
        str(e.get("what")): f"{e.get('what')} failed: {e.get('message')}"
        for e in recorder.uplink_errors()
    }


def _report(
    outcome: Closeout | None,
    supervisor: Supervisor,
    run_id: str,
    path: str,
    recorder: Recorder,
) -> None:
    causes = _causes(recorder)
    if outcome is not None and outcome.others_left:
        left = outcome.others_left
        # A journal another process ships on (a sync of its copy) is not the user's to replay.
        replay = any(not why.startswith(ranks.BEING_SHIPPED) for why in left.values())
        named = "; ".join(f"{where}: {why}" for where, why in left.items())
        ship = " Ship each with: primeruns replay <its journal>" if replay else ""
        said = (
            f"run {run_id} was closed while {len(left)} other process(es) of it had not "
            f"shipped everything ({named}); what they journaled is kept.{ship}"
        )
        # In run.errors too: a caller checking them after finish() (a
        # launcher, a notebook with logging off) read a run closed whole.
        recorder.note_text(f"finish: {said}")
        log.warning("prime-runs: %s", said)
    if outcome is None:
        pid = getattr(supervisor.uplink, "pid", None)
        if pid is None:  # an uplink in threads: it ends with this process
            log.warning(
                "prime-runs: run %s is still being shipped by threads of this process, "
                "which close it out if it lives long enough; everything is in the journal "
                "at %s (once the process has exited, ship the rest with: primeruns replay %s)",
                run_id,
                path,
                path,
            )
            return
        log.warning(
            "prime-runs: run %s is still being shipped by its uplink (pid %s), which "
            "closes it out when done; everything is in the journal at %s (if the uplink "
            "is stopped, ship it with: primeruns replay %s)",
            run_id,
            pid,
            path,
            path,
        )
        return
    if outcome.stalled_s is not None:
        log.warning(
            "prime-runs: nothing shipped for %.0f s; not waiting any longer", outcome.stalled_s
        )
    if not outcome.drained or outcome.pending:
        # A run never registered ships nothing: its registration's failure is the cause.
        blamed = [*outcome.pending] if outcome.registered else ["register"]
        why = [causes[what] for what in blamed if what in causes]
        log.warning(
            "prime-runs: %d record(s) of run %s were not shipped (%s)%s; they are kept "
            "in the journal. Ship them with: primeruns replay %s",
            sum(outcome.pending.values()),
            run_id,
            ", ".join(f"{k}: {v}" for k, v in outcome.pending.items()) or "finalize pending",
            "".join(f"; {line}" for line in why),
            path,
        )
    elif not outcome.finalized:
        log.warning(
            "prime-runs: run %s is not closed out on the platform yet (it could not "
            "be reached); everything is shipped. Close it out with: primeruns replay %s",
            run_id,
            path,
        )


def _lose_unshipped(journal: Journal, outcome: Closeout | None, run_id: str) -> None:
    """A journal in memory (no folder took it): what the close-out could not
    ship dies with this process, so it is counted as lost
    (``run.failed_records``) and said once, with no command to ship it later."""
    if outcome is None:
        log.warning(
            "prime-runs: run %s is still being shipped by threads of this process; its "
            "journal is in memory (no folder could take it), so what they have not shipped "
            "when the process exits is lost",
            run_id,
        )
        return
    pending = {sink: count for sink, count in outcome.pending.items() if count}
    reason = "not shipped before the run finished, and its journal was in memory only"
    for sink, count in pending.items():
        with contextlib.suppress(JournalError, ValueError):
            journal.record_loss(sink, count, reason)
    if pending or not outcome.finalized:
        log.warning(
            "prime-runs: run %s %s; its journal was in memory (no folder could take it), "
            "so the %d record(s) not shipped (%s) are lost, counted in run.failed_records",
            run_id,
            "is closed out" if outcome.finalized else "is not closed out on the platform",
            sum(pending.values()),
            ", ".join(f"{k}: {v}" for k, v in pending.items()) or "none",
        )


def _describe(error: str | BaseException) -> str:
    try:
        if isinstance(error, BaseException):
            text = str(error)
            return f"{type(error).__name__}: {text}" if text else type(error).__name__
        return str(error)
    except Exception:  # an exception whose __str__ raises still ends the run
        return type(error).__name__
