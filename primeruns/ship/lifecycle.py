"""A run's life on the platform: register, update, finalize (docs/ARCHITECTURE.md, "The wire").

The run's spec and its platform binding live in the journal's meta, so the
same code registers a live run at ``init()``, a run whose platform was down at
``init()`` once it is back, an offline run at ``primeruns sync`` and a crashed
run at ``primeruns replay``. Every step records its outcome in the journal
before the next, so a crash between steps repeats nothing that succeeded.

Registration is not replayable (a resend could register a second run), so
only failures that surely did not reach the server are retried at once.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from primeruns.logs import get_logger

from .. import run_index
from ..exceptions import (
    APIError,
    ConfigurationError,
    EnvironmentResolutionError,
    ForbiddenError,
    JournalError,
    LineFormatConflictError,
    NotFoundError,
    PaymentRequiredError,
    RetryableAPIError,
    TransportError,
    UnauthorizedError,
    UnprovenAnswerError,
    is_transient,
)
from ..journal import Journal, in_memory
from ..platform import PlatformClient, is_ambiguous, never_reached
from ..platform.binding import Binding
from ..platform.client import json_body
from ..platform.errors import OversizeAnswerError
from ..platform.paths import segment
from ..ranks import is_primary
from ..spec import RunSpec, SpecEnvironment, journal_spec
from . import eval_lookup, readback, run_keys
from .family import K_FORK_PARENT, K_FORK_PARENT_PATH, parent_binding
from .policy import RetryPolicy
from .standby import pause

__all__ = ["K_FORK_PARENT", "Lifecycle", "crash_reason", "status_message"]

log = get_logger("primeruns.lifecycle")

# Authorization failures are about the key, not the environment: they surface as such.
_AUTH_ERRORS = (UnauthorizedError, ForbiddenError, PaymentRequiredError)
# An attempt always gets at least this long, even past its deadline.
_MIN_ATTEMPT_S = 1.0
_EVAL_STATUS = {"failed": "FAILED", "cancelled": "CANCELLED", "crashed": "FAILED"}
_ERROR_MESSAGE_CAP = 4096
# The SDK's own namespace in an evaluation's metadata.
_NAMESPACE = eval_lookup.NAMESPACE
# A process stops retrying a create that has no lookup (a training run's)
# after this many lost answers, live or closing: each may have left an empty
# run on the platform. A flaky link (10% of answers lost) loses three in a
# row once in ~300; a gateway answering every create with nothing, always.
_MAX_LOST_CREATES = run_keys.CREATES_ALLOWED  # (a run key's processes share as many)
# Journal meta: when a create request was first sent (its answer may be lost).
K_CREATE_SENT = "create_sent"
# Journal meta: how many training creates, by every process that shipped the
# journal, went unanswered or were answered without the run's id: each may
# have made an empty RUNNING run on the platform (the warnings count them).
K_CREATES_LOST = "creates_lost"


def _answer_lost(exc: APIError) -> bool:
    """Whether a failed training create may have made the run (its answer
    lost): a transport failure after it was sent, a 2xx without the run's
    id, a gateway's timeout (504: forwarded, then not waited for) or a 408
    (a proxy's may come after it passed the request on)."""
    if isinstance(exc, TransportError | UnprovenAnswerError):
        return is_ambiguous(exc)
    return isinstance(exc, RetryableAPIError) and exc.status_code in (408, 504)


class KeyCreatesSpent(UnprovenAnswerError):
    """A training run's create not sent: other processes of its run key
    lost the key's allowance of answers (``run_keys.lost_creates``), and
    one more may leave one more empty run. Transient: ``init()`` goes on
    journaling; the live run's uplink waits for ``until`` (wall time: the
    key's window ends) once, then tries again; a closing registration (a
    close-out, replay, sync) gives up at once."""

    until: float | None = None
    # Seconds from the refusal until the window ends on the clock that
    # counts it (the boot clock for a record of this boot): what is waited.
    left: float = 0.0


def crash_reason(error: str | None) -> str:
    return f"crashed: {error or 'crashed'}"


def status_message(status: str, error: str | None) -> str | None:
    """The error message the platform records for a terminal status."""
    if status == "completed":
        return None
    if status == "cancelled":
        return f"cancelled: {error or 'cancelled'}"
    if status == "crashed":
        return crash_reason(error)
    return error or "failed"


class Lifecycle:
    """Registers and closes out one journal's run. Thread-safe: registration
    and finalization are serialized, so a background retry and ``finish()``
    can never register the run twice."""

    def __init__(
        self,
        journal: Journal,
        client: PlatformClient,
        *,
        policy: RetryPolicy,
        on_failure: Callable[[str, BaseException], None],
    ) -> None:
        self.journal = journal
        self.client = client
        self._policy = policy
        self._on_failure = on_failure
        self._rng = random.Random()
        self._lock = threading.RLock()
        self._deadline: float | None = None  # of the close-out under way
        # The longest wait between two tries of a registration under way
        # (``register(longest_wait=...)``): one asked for beyond it fails the
        # call; and when (monotonic) it must be over (``register(within=...)``).
        self._longest_wait: float | None = None
        self._over_by: float | None = None
        # The request a registration round is trying (``_call``, under the
        # lock): where a failed round ended, for the retry schedule.
        self._trying: str | None = None
        # Training creates this process sent whose answers were lost (no
        # lookup can tell whether they landed): bounded by _MAX_LOST_CREATES.
        self._lost_creates = 0
        self._gave_up_creating = False
        # ``_lost_creates`` when the live uplink, refused by its run key's
        # lost creates, waited for the key's window to end (None: it has
        # not): once per process (again only for that window, woken before
        # it ended), and one lost create after it ends its tries.
        self._lost_before_wait: int | None = None
        self._waited_until: float | None = None  # the end of the window it waited for

    # -- state in the journal ----------------------------------------------
    @property
    def spec(self) -> RunSpec:
        """The run's spec; raises ``SpecError`` for one of the wrong shape."""
        return journal_spec(self.journal)

    def binding(self) -> Binding | None:
        bound = self.journal.get_meta("platform")
        if not isinstance(bound, dict) or not bound.get("run_id"):
            return None
        return Binding(run_id=str(bound["run_id"]), kind=str(bound["kind"]), url=bound.get("url"))

    @property
    def finalized(self) -> bool:
        return bool(self.journal.get_meta("finalized"))

    # -- calls -------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        replayable: bool = True,
        attempts: int | None = None,
        deadline: float | None = None,
        check: Callable[[dict[str, Any]], None] | None = None,
        not_retried: type[APIError] | None = None,
    ) -> dict[str, Any]:
        """One platform call with retries on transient failures: ``attempts``
        of them, or with a ``deadline`` (monotonic) as many as fit before it
        (at least one), each attempt's time also capped by it. ``check``
        judges each answer: what it raises is that attempt's failure. A
        failure of type ``not_retried`` is raised at once (the caller's
        remedy is another request, not the same again)."""
        tries = attempts or self._policy.attempts_per_strike
        attempt = 0
        self._trying = f"{method} {path.partition('?')[0]}"
        while True:
            within = None
            if deadline is not None:
                within = max(deadline - time.monotonic(), _MIN_ATTEMPT_S)
            over_by = self._over_by
            if over_by is not None:
                left = max(over_by - time.monotonic(), _MIN_ATTEMPT_S)
                within = left if within is None else min(within, left)
            try:
                answer = self.client.api(method, path, body, within=within)
                if check is not None:
                    check(answer)
                return answer
            except APIError as exc:
                attempt += 1
                retry_after = exc.retry_after if isinstance(exc, RetryableAPIError) else None
                wait = self._policy.delay(attempt - 1, retry_after, self._rng)
                if deadline is None:
                    out_of_time = attempt >= tries
                else:
                    out_of_time = time.monotonic() + wait >= deadline
                if self._longest_wait is not None and wait > self._longest_wait:
                    out_of_time = True  # (a Retry-After longer than the caller waits)
                if over_by is not None and time.monotonic() + wait >= over_by:
                    out_of_time = True
                if not is_transient(exc) or out_of_time or (not replayable and is_ambiguous(exc)):
                    raise
                if not_retried is not None and isinstance(exc, not_retried):
                    raise
                pause(wait)

    def register(
        self,
        *,
        attempts: int | None = None,
        longest_wait: float | None = None,
        within: float | None = None,
    ) -> Binding:
        """Create the run on the platform (or bind an attached id) and record it.
        ``init()``'s quick try bounds it (the uplink's registration in the
        background goes on from where it failed): ``longest_wait``, a retry
        that would wait longer (a long Retry-After) is not made and the
        failure is raised; ``within``, the seconds its requests and waits
        may take all told (each request's timeout is cut to what is left)."""
        with self._lock:
            self._longest_wait = longest_wait
            self._over_by = None if within is None else time.monotonic() + within
            try:
                return self._register(attempts)
            finally:
                self._longest_wait = self._over_by = None

    def register_retrying(
        self, *, deadline: float | None = None, stop: threading.Event | None = None
    ) -> Binding | None:
        """The one registration routine of every path that ships (the live
        run's uplink, a close-out, replay, sync): register, retrying transient
        failures on the policy's schedule, until registered, ``stop`` is set,
        or, with a ``deadline`` (a closing run), the deadline passes or the
        platform is stuck by the policy's rule (no answer for ``stall_s``
        despite ``stuck_attempts`` tries). A failure it gives up on is
        reported through ``on_failure``; returns the binding, or None.

        A training run's create cannot be looked up after its answer was
        lost (the contract reads a training run by its id only), so each
        retry of it may leave an empty run on the platform: a process gives
        up after ``_MAX_LOST_CREATES`` lost answers, live or closing (the
        live run's uplink and its close-out share them), and the failure
        counts the runs that may remain. The records stay in the journal
        for ``primeruns replay``, which has the same allowance. The
        processes of a run key share one allowance (``_spend_key_create``);
        a live registration refused by it waits for the key's window to end,
        once, and tries again (``_lost_before_wait``)."""
        started = time.monotonic()
        failed = 0
        reached = False  # whether any try connected to the platform
        # The backoff counts the rounds in a row that failed at the same
        # request, not every failed round. A round (below) starts over at any
        # failure: on a platform failing a quarter of its requests, a round of
        # six (the environment, four lookup pages of a create answered 500,
        # the create) succeeds one time in six. Counted per round, the
        # closing backoff reached its cap (7.5 s) while the platform answered
        # most requests: a run ended by SIGTERM spent its whole 20 s grace on
        # twelve rounds and the waits between them, and shipped nothing.
        # Failures moving from request to request are a flaky platform, and
        # a closing registration's schedule starts over; one request failing
        # again and again (an outage, creates refused while the rest answers)
        # backs off as before. A live one counts every failed round (below).
        again = 0
        failed_at: str | None = None
        stopping = stop if stop is not None else threading.Event()  # never set: a plain delay
        while True:
            if self._gave_up_creating:
                return None  # said once already (``_creates_lost``)
            # One try of each request per round; the rounds follow the
            # policy's schedule (closing: at most its share of the stall
            # allowance) and can be stopped between tries. A request's own
            # retries would sleep on inside the call, holding the
            # registration's lock: a close-out then waited for the background
            # round's whole backoff (finish() took 16 s at a 5 s allowance).
            # A round that fails on any request starts over from the first,
            # which the lookup by client token makes safe.
            lost_before = self._lost_creates
            try:
                bound, exc, at = self._round()
            # A spec that cannot be registered (lost to damage), or a journal's
            # loopback platform whose port another user took (loopback_owner).
            except Exception as damaged:
                if self.journal.closed:  # (not damage: see Uplink._register_until_closing)
                    return None
                self._on_failure("register", damaged)
                return None
            if bound is not None:
                return bound
            assert exc is not None
            if isinstance(exc, KeyCreatesSpent):
                if deadline is None and exc.until is not None and self._waits_for(exc.until):
                    # Live: a requeue after a gateway's blip would ship nothing
                    # until a user ran replay. Wait for the key's window here
                    # (the uplink's thread: the producer's calls and finish()'s
                    # budget stay as they were), then try once more; a finish()
                    # before then ends the wait, and its close-out gives up.
                    if self._lost_before_wait is None:
                        self._lost_before_wait = self._lost_creates
                        self._say_waiting(exc.until, exc.left)
                    self._waited_until = exc.until
                    # Not until the wall time named: it may be the stamped end,
                    # up to a second before the boot clock's (the wall clock
                    # stepped forward a little), and a wait woken before the
                    # window ends is refused again and gives up for good.
                    if stopping.wait(max(0.0, exc.left)):
                        return None
                    continue
                self._gave_up_creating = True
                self._on_failure("register", exc)
                return None
            if not is_transient(exc):
                self._on_failure("register", exc)
                return None
            failed += 1
            again = again + 1 if at == failed_at else 1
            failed_at = at
            reached = reached or not never_reached(exc)
            # Past the key's window, one lost create ends this process's tries:
            # N processes refused at once each add at most one to the key's.
            waited = self._lost_before_wait
            lost_after_wait = waited is not None and self._lost_creates > waited
            if self._lost_creates > lost_before and (
                self._lost_creates >= _MAX_LOST_CREATES or lost_after_wait
            ):
                self._gave_up_creating = True
                self._on_failure("register", self._creates_lost(exc))
                return None
            now = time.monotonic()
            if deadline is not None and (
                now >= deadline
                or self._policy.stuck(now - started, failed)
                or (not reached and self._policy.unreached(now - started, failed))
            ):
                self._on_failure("register", exc)
                return None
            retry_after = exc.retry_after if isinstance(exc, RetryableAPIError) else None
            closing = deadline is not None
            # Only a closing registration starts its schedule over when the
            # failing request changes: its deadline and the stall rule bound
            # it. A live one has neither, and a platform failing whichever
            # request it cannot take (rarely the same one twice in a row)
            # would be retried at the base delay for as long as it struggles.
            tried = again if closing else failed
            wait = self._policy.delay(tried - 1, retry_after, self._rng, closing=closing)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            if stopping.wait(wait):  # a retry delay, cut short by ``stop``
                return None

    def _round(self) -> tuple[Binding | None, APIError | None, str | None]:
        """One round of registration, one try of each request: the binding,
        or the failure that ended the round and the request it came from."""
        with self._lock:
            self._trying = None  # none made (a forked child's parent not registered yet)
            try:
                return self._register(1), None, None
            except APIError as exc:
                return None, exc, self._trying

    def _creates_lost(self, last: APIError) -> UnprovenAnswerError:
        """The failure a registration gives up with once its training creates
        lost ``_MAX_LOST_CREATES`` answers: how many runs may remain."""
        lost = max(_count(self.journal.get_meta(K_CREATES_LOST)), self._key_lost())
        name = self.spec.name
        failure = UnprovenAnswerError(
            f"{self._lost_creates} creates of training run {name!r} here went unanswered "
            f"or were answered without the run's id (last: {last}); the platform offers "
            f"no lookup of training runs, so up to {lost} empty RUNNING runs named "
            f"{name!r} may remain; not creating another"
        )
        failure.__cause__ = last
        return failure

    def _waits_for(self, until: float) -> bool:
        """Whether a live registration refused by its key's window ending at
        ``until`` (wall time) waits for it: the first time, or again for the
        window it waited for. That one refusing again counted no create since
        (one counted after it ends a window later): the wait woke before it
        ended (a wall clock stepped back, for a record read on it), and a
        refusal taken as a new window gave up for good with nothing sent."""
        waited = self._waited_until
        return waited is None or until < waited + run_keys.LOST_WINDOW_S / 2

    def _say_waiting(self, until: float, left: float) -> None:
        when = time.strftime("%H:%M:%S UTC", time.gmtime(until))
        log.warning(
            "prime-runs: training run %r is not registered yet: the %d creates its run "
            "key allows within %.0f s went unanswered; this process tries one more "
            "create at %s (in %.0f s) if the run is still going. A finish() before then "
            "keeps the records in the journal for primeruns replay.",
            self.spec.name,
            _MAX_LOST_CREATES,
            run_keys.LOST_WINDOW_S,
            when,
            left,
        )

    def _key_lost(self) -> int:
        """The lost creates of this run's key, by every process (0 unkeyed)."""
        key = self._run_key
        return 0 if key is None else run_keys.lost_creates(key, self._api_root)

    def _spend_key_create(self, spec: RunSpec) -> int:
        """Count a training create of a keyed run against the key before it
        is sent (under the key's lock), or refuse it once the key's processes
        lost ``_MAX_LOST_CREATES`` answers: each process's own bound let N
        ranks of one key leave up to 4N empty runs behind a gateway losing
        every answer. Returns the key's lost creates before this one."""
        key = spec.run_key
        if key is None:
            return 0
        spent, until, left = run_keys.lost_creates_window(key, self._api_root)
        if spent >= _MAX_LOST_CREATES and until is not None:
            # When, in both words: a user reading the warning later (a log,
            # run.errors) needs the clock time, one reading it live the wait.
            left = max(0.0, left)
            when = time.strftime("%H:%M:%S UTC", time.gmtime(until))
            refused = KeyCreatesSpent(
                f"{spent} creates of training run {spec.name!r} (run key {key!r}) by "
                "this job's processes went unanswered or were answered without the "
                "run's id; the platform offers no lookup of training runs, so up to "
                f"{spent} empty RUNNING runs named {spec.name!r} may remain; not creating "
                f"another until {when} (in {left:.0f} s, {run_keys.LOST_WINDOW_S:.0f} s "
                "after the last): the records stay in the journal, and primeruns "
                "replay from then ships them, into the run a later process of the key "
                "created if one did (a requeue ships its own records, not these)"
            )
            refused.until, refused.left = until, left
            raise refused
        run_keys.count_lost_create(key, self._api_root, 1)
        return spent

    def _register(self, attempts: int | None) -> Binding:
        bound = self.binding()
        if bound is not None:
            return bound
        spec = self.spec
        if not spec.attach_id and self.journal.get_meta(K_FORK_PARENT):
            # A child forked before its parent's run was registered (or from
            # an offline run): it ships into the parent's run, once there is one.
            journal = self.journal
            parent = parent_binding(
                journal.get_meta(K_FORK_PARENT), journal.get_meta(K_FORK_PARENT_PATH)
            )
            return self._bind(spec, str(parent["run_id"]), parent.get("name"), parent.get("url"))
        if spec.run_key is None or spec.attach_id:
            return self._create(spec, attempts)
        # A keyed run (several journals in turn): the first to register creates
        # it, the others ship into it; the key's lock makes two at once one.
        api_root = self._api_root
        # Within init()'s bound (``register(within=...)``), if it has one.
        with run_keys.held(spec.run_key, api_root, until=self._over_by):
            found = run_keys.lookup(spec.run_key, api_root)
            if found is not None and found.get("kind") == spec.kind:
                log.info("prime-runs: run key %r names run %s", spec.run_key, found["run_id"])
                return self._bind(spec, found["run_id"], found.get("name"), found.get("url"))
            binding = self._create(spec, attempts)
            record = {"run_id": binding.run_id, "kind": binding.kind, "url": binding.url}
            run_keys.remember(spec.run_key, api_root, record)
            return binding

    def _create(self, spec: RunSpec, attempts: int | None) -> Binding:
        """Create the run (an evaluation found by its client token is adopted)."""
        kind = spec.kind
        attach = spec.attach_id
        if attach:
            run_id, name, url = attach, spec.name, None
        elif kind == "train":
            body = self._train_body(spec)
            lost = _count(self.journal.get_meta(K_CREATES_LOST))
            # This journal's lost creates, or its run key's, by every process.
            may_remain = max(lost, self._spend_key_create(spec))
            if may_remain:
                # External runs cannot be looked up: say what may remain.
                log.warning(
                    "prime-runs: %d earlier request(s) to create training run %r may have "
                    "landed with their answers lost; the platform offers no lookup, so up "
                    "to %d empty RUNNING runs named %r may remain beside this one",
                    may_remain,
                    spec.name,
                    may_remain,
                    spec.name,
                )
            self.journal.set_meta(K_CREATE_SENT, time.time())  # before the request
            # Counted before the request, as lost until its answer says
            # otherwise: a process that dies waiting for it leaves it counted.
            self.journal.set_meta(K_CREATES_LOST, lost + 1)
            try:
                created = self._call(
                    "POST", "/rft/external-runs", body, replayable=False, attempts=attempts
                )
                run = _as_dict(created.get("run"))
                if not run.get("id"):
                    # A gateway's {} or empty 200: the run may or may not exist.
                    raise UnprovenAnswerError(
                        "the create of the training run was answered without its id; "
                        "it may or may not have been created"
                    )
            except APIError as exc:
                # An answer lost on the way back (not a 5xx, which the platform
                # sends when it refused the request as a whole). A 2xx without
                # the created run's id is no better than none, and a gateway's
                # timeout (504) no better than the client's own: the create
                # was forwarded, and a slow platform makes the run after the
                # gateway gave up (taken for a refusal, a live run behind one
                # retried for as long as it lived: 15 s left 11 empty runs).
                if _answer_lost(exc):
                    self._lost_creates += 1
                else:  # refused as a whole, or never sent: it made no run
                    self.journal.set_meta(K_CREATES_LOST, lost)
                    if spec.run_key is not None:
                        run_keys.count_lost_create(spec.run_key, self._api_root, -1)
                raise
            self.journal.set_meta(K_CREATES_LOST, lost)  # this one is the run
            run_id, name, url = str(run["id"]), run.get("name") or spec.name, None
        else:
            body = self._eval_body(spec, attempts)
            created = None
            if self.journal.get_meta(K_CREATE_SENT) or spec.run_key:
                # An earlier create may have landed with its answer lost (or the
                # process died waiting): adopt that run rather than make a ghost.
                created = self._find_created(body, attempts)
            if created is None:
                self.journal.set_meta(K_CREATE_SENT, time.time())  # before the request
                created = self._call(
                    "POST", "/evaluations/", body, replayable=False, attempts=attempts
                )
            if not created.get("evaluation_id"):
                # A gateway's {} or empty 200: the evaluation may exist. Ambiguous,
                # so the retry looks it up by its token (K_CREATE_SENT) first.
                raise UnprovenAnswerError(
                    "the create of the evaluation was answered without its evaluation_id; "
                    "it may or may not have been created"
                )
            run_id = str(created["evaluation_id"])
            name, url = created.get("name") or spec.name, created.get("viewer_url")
        return self._bind(spec, run_id, name, url)

    def _bind(self, spec: RunSpec, run_id: str, name: Any, url: Any) -> Binding:
        """Record the platform run this journal ships to, and return it."""
        kind = spec.kind
        if not url:
            section = "training" if kind == "train" else "evaluations"
            url = f"{spec.frontend_url.rstrip('/')}/dashboard/{section}/{run_id}"
        binding = Binding(run_id=run_id, kind=kind, url=str(url))
        from .mirror import K_SOURCE_ORIGIN

        if not in_memory(self.journal) and self.journal.get_meta(K_SOURCE_ORIGIN) is None:
            # Before the meta names the run: a process killed between the two
            # leaves a marker a look passes over (its meta names no run), never
            # a journal of the run no look reads. (A sync journal's original is
            # where its run's processes look.)
            run_index.note(self.journal.path, run_id)
        self.journal.set_meta(
            "platform",
            {
                "run_id": run_id,
                "kind": kind,
                "url": str(url),
                "name": name,
                "base_url": self.client.settings.api_root,
                "attached": bool(spec.attach_id),
            },
        )
        return binding

    def _client_token(self) -> str:
        """This run's token on the platform: its run key, else the journal's
        local id, unique per journal and the same for every process that
        ships it (replay, sync)."""
        return self.spec.run_key or self.journal.local_id

    def _metadata(self, spec: RunSpec) -> dict[str, Any]:
        """The run's config, plus the SDK's own namespace carrying the token."""
        metadata = dict(spec.config)
        metadata[_NAMESPACE] = {"client_token": self._client_token()}
        return metadata

    def _find_created(self, body: Mapping[str, Any], attempts: int | None) -> dict[str, Any] | None:
        """The evaluation an earlier create of this run made, looked up by its
        client token among the newest evaluations of its team and dataset
        (``eval_lookup``: in smaller pages where a page's answer is too large).
        Without a run key, the token is the journal's local id, which an
        earlier sync journal of it (gone, and synced anew) gave the run it
        made and closed: a closed one is not adopted (``open_only``)."""

        def get(path: str) -> dict[str, Any]:
            return self._call("GET", path, attempts=attempts, not_retried=OversizeAnswerError)

        size = len(json_body(body))
        token, keyed = self._client_token(), self.spec.run_key is not None
        return eval_lookup.find_created(get, body, token, size, open_only=not keyed)

    def _resolve_environments(self, spec: RunSpec, attempts: int | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        team = spec.team_id
        for ref in spec.environments:
            env_id: Any = None  # the hub's answer: checked below
            data: Mapping[str, Any] = {}
            try:
                if ref.id:
                    env_id = ref.id
                elif ref.slug:
                    owner, _, name = ref.slug.partition("/")
                    latest = f"/environmentshub/{segment(owner)}/{segment(name)}/@latest"
                    data = self._call("GET", latest, attempts=attempts)
                    inner = _as_dict(data.get("data")) or data
                    env_id = inner.get("id")
                else:
                    body = {"name": ref.name, **({"team_id": team} if team else {})}
                    data = self._call("POST", "/environmentshub/resolve", body, attempts=attempts)
                    inner = _as_dict(data.get("data"))
                    env_id = inner.get("id")
            except APIError as exc:
                if is_transient(exc) or isinstance(exc, _AUTH_ERRORS):
                    raise
                self._blame_the_base_url(exc, ref)
                raise EnvironmentResolutionError(
                    f"environments: could not resolve {_ref_text(ref)}: {exc}"
                ) from exc
            if not env_id and "data" not in data and "id" not in data:
                # An answer that says nothing (empty, ``{}``: a gateway's 200)
                # is not the hub's word that the environment does not resolve:
                # the resolve is a read or a get-or-create, safe to ask again.
                raise UnprovenAnswerError(
                    f"environments: the hub answered without an id for {_ref_text(ref)}; "
                    "asking again"
                )
            if not env_id:
                raise EnvironmentResolutionError(
                    f"environments: the hub returned no id for {_ref_text(ref)}"
                )
            entry = {"id": str(env_id)}
            if ref.version_id:
                entry["version_id"] = ref.version_id
            out.append(entry)
        return out

    def _blame_the_base_url(self, exc: APIError, ref: SpecEnvironment) -> None:
        """A 404 from the hub under a base_url with a path of its own (not
        one of the API roots, which settings strip): the path is the likelier
        culprit than the environment, so the error names the URL."""
        settings = self.client.settings
        path = urllib.parse.urlsplit(settings.origin).path
        if exc.status_code != 404 or not path.strip("/"):
            return
        hub = f"{settings.api_root}/environmentshub"
        raise ConfigurationError(
            f"base_url {settings.api_root}: the environments hub at {hub} answered 404 "
            f"(resolving {_ref_text(ref)}), so the path {path!r} in base_url looks wrong: "
            "pass the platform's origin (such as https://api.primeintellect.ai, or "
            "http://127.0.0.1:PORT of primeruns serve), with /api/v1 or nothing after it"
        ) from exc

    def _eval_body(self, spec: RunSpec, attempts: int | None) -> dict[str, Any]:
        environments = self._resolve_environments(spec, attempts)
        if not environments:
            raise EnvironmentResolutionError(
                "environments: an evaluation needs at least one environment; pass "
                "environments=['name'] (resolved through the hub) or [{'id': ...}]"
            )
        body: dict[str, Any] = {
            "name": spec.name,
            "environments": environments,
            "tags": list(spec.tags),
            "model_name": spec.model,
            "dataset": spec.dataset,
            "framework": spec.framework,
            "description": spec.description,
            "metadata": self._metadata(spec),
            "team_id": spec.team_id,
        }
        return {k: v for k, v in body.items() if v is not None or k == "tags"}

    def _train_body(self, spec: RunSpec) -> dict[str, Any]:
        environments = []
        for ref in spec.environments:
            entry = {"id": ref.id or ref.slug or ref.name}
            if ref.version_id:
                entry["version_id"] = ref.version_id
            environments.append(entry)
        body: dict[str, Any] = {
            "base_model": spec.model,
            "environments": environments,
            "team_id": spec.team_id,
            "name": spec.name,
            "run_config": dict(spec.config) or None,
        }
        body.update(spec.training or {"max_steps": 0})
        return {k: v for k, v in body.items() if v is not None}

    # -- close-out -------------------------------------------------------------
    def owns_run(self) -> bool:
        """Whether this journal's close-out closes the platform run: not a
        forked child's, nor a rank's that is not the run's primary."""
        return not self.journal.get_meta(K_FORK_PARENT) and is_primary(self.journal)

    def closes_run(self, status: str) -> bool:
        """Whether finalizing with ``status`` sends anything: this journal
        owns the run, and it completed or the run is its own (an attached
        run that did not complete is its launcher's to close)."""
        if not self.owns_run():
            return False
        return status == "completed" or not self.spec.attach_id

    def why_left_open(self, status: str) -> str | None:
        """Why finalizing with ``status`` leaves the platform run open
        (``closes_run`` is False: its part is done, yet nothing closes the
        run), for a command to say rather than that it closed the run."""
        if self.journal.get_meta(K_FORK_PARENT):
            return "it is a forked child's journal: its parent's close-out closes the run"
        if not is_primary(self.journal):
            return "it is not the run's primary: the primary's close-out closes the run"
        if status != "completed" and self.spec.attach_id:
            return (
                f"it attached to the run by id and ended {status}: the run is its launcher's "
                "(or a requeued job's) to close"
            )
        return None

    def finalize(
        self,
        status: str,
        error: str | None,
        summary: Mapping[str, Any],
        *,
        deadline: float | None = None,
    ) -> bool:
        """Send the run's terminal state, retrying transient failures until
        ``deadline`` (monotonic; default: the usual attempts). Recorded as done
        only when the platform took it, so a replay retries a failed close-out;
        a repeat after success is a no-op. Returns whether it is done."""
        with self._lock:
            if self.finalized:
                return True
            if not self.owns_run():
                # A forked child's journal (its parent closes the run), or a
                # rank that is not the run's primary (``primeruns.ranks``):
                # its part is done, and the run stays open.
                self.journal.set_meta("finalized", {"status": status, "at": time.time()})
                return True
            self._deadline = deadline
            try:
                binding = self.register()
                spec = self.spec
                attached = bool(spec.attach_id)
                closed = self._closed_by_its_key(binding.run_id)
                if closed is not None:
                    status, done = closed, True
                elif binding.kind == "train":
                    done = self._finalize_train(binding.run_id, status, error, attached)
                else:
                    done = self._finalize_eval(
                        binding.run_id, status, error, summary, spec, attached
                    )
            finally:
                self._deadline = None
            if done:
                self.journal.set_meta("finalized", {"status": status, "at": time.time()})
                self._note_closed_for_its_key(binding.run_id, status)
            return done

    @property
    def _api_root(self) -> str:
        return self.client.settings.api_root

    @property
    def _run_key(self) -> str | None:
        """The key of a run several journals log in turn (none attached by id)."""
        return None if self.spec.attach_id else self.spec.run_key

    def _closed_by_its_key(self, run_id: str) -> str | None:
        """The status another journal of this run's key closed it with: the
        platform keeps a run's first close, so this one sends none (its own
        end would only be said, wrongly)."""
        key = self._run_key
        if key is None:
            return None
        try:
            return run_keys.closed_as(key, self._api_root, run_id)
        except (JournalError, OSError):
            return None  # no record to read (an untrusted sync root): closed as before

    def _note_closed_for_its_key(self, run_id: str, status: str) -> None:
        """Tell the run key's later journals how their run was closed."""
        key = self._run_key
        if key is None:
            return
        try:
            run_keys.note_closed(key, self._api_root, run_id, status)
        except (JournalError, OSError) as exc:
            log.info("prime-runs: run key %r: how its run was closed is not recorded: %s", key, exc)

    def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any],
        *,
        closes: str | None = None,
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """A close-out call; ``closes``: the path to read the run back from
        when the answer does not say the run is closed (``_closed``);
        ``check``: judges the answer otherwise."""
        check = check if closes is None else (lambda answer: self._closed(answer, closes))
        return self._call(method, path, body, deadline=self._deadline, check=check)

    def _step(self, what: str, call: Callable[[], Any]) -> bool:
        """One close-out call; True when the platform has the outcome."""
        try:
            call()
        except LineFormatConflictError:  # 409: already closed; the outcome is recorded
            log.info("%s: the run was already closed", what)
        except APIError as exc:
            self._on_failure(what, exc)
            return False
        return True

    def _finalize_eval(
        self,
        run_id: str,
        status: str,
        error: str | None,
        summary: Mapping[str, Any],
        spec: RunSpec,
        attached: bool,
    ) -> bool:
        path = f"/evaluations/{segment(run_id)}"
        update: dict[str, Any] = {}
        if spec.config and not attached:
            # The whole metadata, not a patch: the token stays beside the config.
            update["metadata"] = self._metadata(spec)
        if summary:
            update["metrics"] = dict(summary)
        # The summary update is sent first and on its own, so it lands even
        # if the status is refused (409); its failure alone does not hold the
        # close-out back: its retries (an answer that proves nothing) take
        # half of the time left at most, the status the rest.
        if update:

            def landed(answer: dict[str, Any]) -> None:
                self._updated(answer, run_id, path, update)

            deadline = self._deadline
            if deadline is not None:
                self._deadline = time.monotonic() + max(0.0, deadline - time.monotonic()) / 2
            try:
                self._step("update", lambda: self._send("PUT", path, update, check=landed))
            finally:
                self._deadline = deadline
        if status == "completed":
            metrics = {"metrics": dict(summary)}
            return self._step(
                "finalize",
                lambda: self._send("POST", f"{path}/finalize", metrics, closes=path),
            )
        if attached:
            return True  # the launcher owns a failed attached run's status
        body: dict[str, Any] = {"status": _EVAL_STATUS.get(status, "FAILED")}
        message = status_message(status, error) if status == "crashed" else error
        if message:
            body["error_message"] = message[:_ERROR_MESSAGE_CAP]
        return self._step("finalize", lambda: self._send("PUT", path, body, closes=path))

    def _updated(
        self, answer: Mapping[str, Any], run_id: str, read_path: str, sent: Mapping[str, Any]
    ) -> None:
        """Raise unless an evaluation's update (its summary, its metadata) is
        known to have landed: the platform answers with the evaluation; a
        silent answer (a gateway's empty 200 or ``{}``, which may never have
        forwarded it) is checked by reading the evaluation back. Taken
        unproven, a failed run's summary was lost: its close-out, unlike a
        completed run's finalize, does not carry it. Where the platform
        offers no read (404), or its read shows no such field (one shown as
        null is there, empty), the answer is taken; a read that does not
        name the evaluation either (the gateway's empty 200 again) proves
        nothing, and the update is sent again."""

        def names_it(answer: Mapping[str, Any]) -> bool:
            return str(answer.get("evaluation_id") or answer.get("id") or "") == run_id

        if names_it(answer):
            return
        try:
            found = self._send("GET", read_path, {})
        except NotFoundError:
            return
        if not names_it(found):
            raise UnprovenAnswerError(
                "the update of the evaluation was answered without the evaluation, and so "
                "was the read of it; sending it again"
            )
        for field_name, value in sent.items():
            if field_name not in found:
                continue  # a read that shows no such field: nothing to compare
            stored = found[field_name]
            if stored is None:
                # Shown as null: a store that keeps it null until it is set
                # (read as "no such field", a swallowed summary was taken).
                stored = {}
            # Anything else is compared too: a field read back as a list, a
            # number or text that is not the object sent was skipped, and a
            # swallowed update taken as landed (readback.shows reads an
            # object kept as JSON text).
            # As a JSON store may keep it (1.0 for 1, a null dropped): compared
            # with ==, a landed summary was sent again until time ran out.
            if not readback.shows(stored, value):
                raise UnprovenAnswerError(
                    f"the update of the evaluation's {field_name} was answered without the "
                    "evaluation and is not on the platform; sending it again"
                )

    def _closed(self, answer: Mapping[str, Any], read_path: str) -> None:
        """Raise unless the run is closed on the platform: an answer naming a
        terminal status says so; a silent one (the contract lets the platform
        answer ``{}`` or nothing, and so does a gateway that never forwarded
        the request) is checked by reading the run back. Where the platform
        offers no read (404: the internal API), the answer is taken."""
        if _terminal(answer):
            return
        try:
            found = self._send("GET", read_path, {})
        except NotFoundError:
            return
        if not _terminal(found):
            raise UnprovenAnswerError(
                "the close-out was answered without a status and the run is not closed "
                "on the platform; sending it again"
            )

    def _finalize_train(self, run_id: str, status: str, error: str | None, attached: bool) -> bool:
        status_path = f"/rft/external-runs/{segment(run_id)}/status"
        read_path = f"/rft/runs/{segment(run_id)}"
        if status == "completed":
            try:
                body = {"run_id": run_id, "exit_code": 0}
                self._send("POST", "/rft/finalize", body, closes=read_path)
            except APIError:
                fallback = {"status": "completed"}
                return self._step(
                    "finalize",
                    lambda: self._send("PUT", status_path, fallback, closes=read_path),
                )
            return True
        if attached:
            return True
        body = {"status": "failed", "error_message": status_message(status, error) or "failed"}
        return self._step(
            "finalize", lambda: self._send("PUT", status_path, body, closes=read_path)
        )


_TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "STOPPED"})


def _terminal(answer: Mapping[str, Any]) -> bool:
    """Whether an answer (a close-out's, or a run read back, bare or under
    ``run``) names a terminal status."""
    for source in (answer, _as_dict(answer.get("run"))):
        status = source.get("status")
        if isinstance(status, str) and status.upper() in _TERMINAL:
            return True
    return False


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _ref_text(ref: SpecEnvironment) -> str:
    for key, value in (("slug", ref.slug), ("name", ref.name), ("id", ref.id)):
        if value:
            return f"{key}={value!r}"
    return repr(ref.to_json())


def _count(value: Any) -> int:
    """A counter kept in journal meta (0 when absent or damaged)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
