"""A backlog's batch of several training sample objects, sent a stage at a time
with the objects' requests in flight together.

Each object of the training sample table takes three requests (presign, PUT,
confirm; contract §3.6), and a batch of one step's object waited out three
round trips one after another: a sync of a long offline run spent most of
its time waiting, the sync and the platform taking turns, neither busy
(5,000 steps: ~2.9 s for the 500 objects alone). When the journal holds
several steps, a batch carries up to ``MAX_OBJECTS`` of them, and each stage
goes for every object that needs it at once (``sinks.fanout``): all presigns,
then all PUTs, then all confirms, and the confirms only once every object's
bytes landed: until then nothing of the batch is stored, so an object over
a size limit (413) refuses the batch whole and the shipper sends its records
anew in smaller batches, as it does a batch of one step's object, rather
than count them lost.

What a resend needs is recorded once per stage, not once per request: each
object's ``stage`` (``NEW``, ``MINTED``: its key and URL recorded, ``PUT``:
its bytes landed, ``DONE``: confirmed, ``REFUSED``: refused for its
content; ``EXPIRED`` below), with its key and URL, by its place in the
batch. A request whose answer was lost is therefore resent to the same
key (a PUT of the same bytes, or a confirm again: both idempotent), and no
object is ever made twice of the same records; an object whose stage was
not recorded yet when the process died is minted anew, which leaves at most
a URL nothing was uploaded under.

A batch is refused whole only while no object of it may be stored. An
object may be stored once a confirm of its key was sent, whether or not its
answer came: the batch is then settled object by object, an object over a
size limit refused alone (its records counted as failed), and the one that
may be stored confirmed again (idempotent) rather than made anew by the
split. Refused whole then, the shipper would send that object's records
again in a smaller batch, under a new key: stored twice. So a confirm is
sent only once the journal says it may have been: the confirms of the last
stage once every object's bytes landed (recorded), and the confirm that
asks whether an expired URL's bytes landed once the object is recorded
``EXPIRED`` (``expired_url_landed``), a stage of its own after the PUTs.
A version before ``EXPIRED`` reads it as damage and counts the batch's
records as failed, rather than mint that object anew. That version asked
about an expired URL's object at once, nothing recorded first, so a batch it
left may hold an object recorded ``MINTED`` that is stored: such an object
is PUT (its URL alive: never asked) or found expired and asked about before
a 413 refuses the batch whole (``_not_asked``).

An object whose confirm finds nothing under its key after both PUTs of its
bytes were answered 2xx (``NothingLanded``: a gateway that never passed them
on) goes back to ``NEW``, to be minted under a new key on the next try; the
keys it went through are counted in the batch's progress (``unlanded``), and
after ``MINTS_UNLANDED`` of them it is refused, its records counted failed
with why (``not_landed``). Nothing is stored under a key its confirm found
empty, so no object is made twice. A confirm that refuses the object's
content (a 400 naming what is wrong: not Parquet, past the table's bounds;
``nothing_under_key`` tells the two apart) is no such case: the same bytes
would be refused under any key, so it is counted at once, with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..exceptions import (
    APIError,
    RetryableAPIError,
    ValidationRejectedError,
    is_record_rejection,
    is_transient,
)
from .fanout import Fanout, NotSent

if TYPE_CHECKING:
    from .base import SendContext
    from .train_samples import TrainSamplesProgress

__all__ = [
    "DONE",
    "EXPIRED",
    "MAX_BATCH_BYTES",
    "MAX_OBJECTS",
    "MINTED",
    "MINTS_UNLANDED",
    "NEW",
    "PUT",
    "REFUSED",
    "NothingLanded",
    "SampleObjects",
    "confirm_put_object",
    "expired_url_landed",
    "not_landed",
    "nothing_under_key",
    "unlanded_of",
    "with_unlanded",
]

# An object's stage, as recorded (a number each, in the batch's order):
# REFUSED is an object the platform refused for its content (413, 422),
# its records counted as failed with the batch's acknowledgement while
# the batch's others go on. EXPIRED is an object whose URL, minted on an
# earlier try, the store refused: a confirm of its key is sent next, to
# tell whether its bytes landed (done) or not (minted anew); recorded before
# that confirm goes, it marks an object that may be stored.
NEW, MINTED, PUT, DONE, REFUSED, EXPIRED = 0, 1, 2, 3, 4, 5
_SETTLED = (DONE, REFUSED)
MAX_OBJECTS = 8  # a backlog's steps in one batch
# ... while their objects come to less than this: a step of long rollouts
# is megabytes of Parquet, and the batch is held whole (memory, the journal).
MAX_BATCH_BYTES = 16 << 20
IN_FLIGHT = 4  # requests at once within a stage
# An object whose PUT and re-PUT the store answered 2xx while its confirm
# finds nothing under the key (a gateway that never passed them on) is sent
# again under a new key, up to this many keys in all; then its records are
# counted failed, with that reason. Counted in the batch's progress
# (``unlanded``), so a restart does not start the count again.
MINTS_UNLANDED = 3


class SampleObjects:
    """Sends recorded batches of several objects for one sink (its helper
    threads are started on first use and ended by ``close``)."""

    def __init__(
        self,
        presign: Callable[[str, int], tuple[str, str]],
        put: Callable[[str, bytes], None],
        confirm: Callable[[str, int, str], None],
        *,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        """``presign(run_id, step)`` -> (url, key); ``put(url, blob)``;
        ``confirm(run_id, step, key)``: each raises when not done (the sink's)."""
        self._presign = presign
        self._put = put
        self._confirm = confirm
        self._fanout = Fanout(in_flight, "primeruns-samples")

    def send(
        self, units: list[tuple[dict[str, Any], bytes]], ctx: SendContext[TrainSamplesProgress]
    ) -> None:
        """One attempt at a batch of ``units`` whose progress has a stage per
        object: the objects not done go a stage further each, the stages
        recorded as they end. Raises the first failure after the others went
        as far as they could, and it was recorded."""
        progress = ctx.progress
        count = len(units)
        if not (len(progress.stages) == len(progress.keys) == len(progress.urls) == count) or any(
            stage not in (NEW, MINTED, PUT, DONE, REFUSED, EXPIRED)
            # Minted or further: its key and URL are what a resend goes on with.
            or (stage in (MINTED, PUT, DONE, EXPIRED) and not (key and url))
            for stage, key, url in zip(progress.stages, progress.keys, progress.urls, strict=False)
        ):
            raise ValueError(
                f"the batch recorded in the journal is damaged: {count} objects, "
                f"stages {list(progress.stages)[:MAX_OBJECTS]}"
            )
        run_id = ctx.binding.run_id
        steps = [int(meta["step"]) for meta, _ in units]
        counts = [int(meta.get("records", 0)) for meta, _ in units]
        for index, stage in enumerate(progress.stages):
            if stage == REFUSED:  # counted when the batch is acknowledged
                ctx.failed_at_ack.setdefault(
                    index,
                    (counts[index], APIError("an object of the batch was refused for its content")),
                )
        minted_now: set[int] = set()
        swallowed: dict[int, int] = {}  # keys found empty so far, by object (``unlanded``)

        def mint(index: int) -> tuple[int, str | None, str | None, BaseException | None]:
            url, key = self._presign(run_id, steps[index])
            minted_now.add(index)
            return MINTED, key, url, None

        def upload(index: int) -> tuple[int, str | None, str | None, BaseException | None]:
            key, url = progress.keys[index], progress.urls[index]
            try:
                self._put(str(url), units[index][1])
            except APIError as exc:
                if exc.status_code != 403 or index in minted_now:
                    raise
                # Asked whether it landed only once this is recorded: from
                # that confirm on, the object may be stored.
                return EXPIRED, key, url, None
            return PUT, key, url, None

        def landed(index: int) -> tuple[int, str | None, str | None, BaseException | None]:
            key, url = str(progress.keys[index]), str(progress.urls[index])
            return self._expired(run_id, steps[index], key, url)

        def confirm(index: int) -> tuple[int, str | None, str | None, BaseException | None]:
            key, url = str(progress.keys[index]), str(progress.urls[index])
            try:
                confirm_put_object(
                    lambda: self._confirm(run_id, steps[index], key),
                    lambda: self._put(url, units[index][1]),
                )
            except NothingLanded as nothing:
                swallowed[index] = unlanded_of(progress.unlanded, index) + 1
                error = not_landed(nothing.refused, steps[index], swallowed[index])
                if is_record_rejection(error):
                    raise error from None  # refused: counted failed with its reason
                return NEW, None, None, error  # minted anew on the next try
            return DONE, key, url, None

        failure: BaseException | None = None
        for stage, step_once in ((NEW, mint), (MINTED, upload), (EXPIRED, landed), (PUT, confirm)):
            todo = [at for at, found in enumerate(progress.stages) if found == stage]
            if stage == PUT and any(found in (NEW, MINTED, EXPIRED) for found in progress.stages):
                # No object is confirmed before every object's bytes landed:
                # until then nothing of the batch is stored, and an object
                # over a size limit (413) can still have the batch split.
                break
            if todo:
                # An object that failed a stage stays at it; the others go on.
                failure = self._stage(ctx, todo, counts, step_once, swallowed) or failure
                progress = ctx.progress
                if failure is not None and _too_large(failure):
                    break  # refused whole: nothing more of it is sent (or stored)
        if failure is None and any(stage not in _SETTLED for stage in ctx.progress.stages):
            # Never acknowledged with an object not settled, whatever went on.
            # (By the stages: a ``done`` recorded short of them, written by
            # another version or damaged, held the batch, and every batch of
            # the sink after it, in flight for good.)
            failure = RetryableAPIError("objects of the batch are not sent yet; sending again")
        if failure is not None:
            raise failure

    def _stage(
        self,
        ctx: SendContext[TrainSamplesProgress],
        todo: Sequence[int],
        counts: Sequence[int],
        step_once: Callable[[int], tuple[int, str | None, str | None, BaseException | None]],
        swallowed: dict[int, int],
    ) -> BaseException | None:
        """``step_once`` on each object of ``todo`` (several at once); what
        they achieved recorded in one write, with the keys found empty of
        each object that ``step_once`` counted (``swallowed``). An object
        refused for its content is settled: its records (``counts``) counted as failed in
        the write that acknowledges the batch (``SendContext.failed_at_ack``),
        so once, whatever dies before it. Returns the first other failure."""
        # A refusal is one object's: the others not started yet still go.
        outcomes = self._fanout.run(
            step_once, todo, give_up=lambda exc: not is_record_rejection(exc)
        )
        before = ctx.progress.stages
        stages = list(before)
        keys = list(ctx.progress.keys)
        urls = list(ctx.progress.urls)
        failure: BaseException | None = None
        errors: dict[int, BaseException] = {}
        for index, outcome in zip(todo, outcomes, strict=True):
            if outcome.value is not None:
                stages[index], keys[index], urls[index], error = outcome.value
            else:
                error = outcome.error
            if error is not None and not isinstance(error, NotSent):
                errors[index] = error
        # Over a size limit (413) while nothing of the batch is stored or
        # counted: the batch is refused whole, and the shipper sends its
        # records anew in smaller batches (as it does a batch of one object)
        # rather than count them lost.
        too_large = next((exc for exc in errors.values() if _too_large(exc)), None)
        if any(stage in _SETTLED for stage in stages) or _maybe_stored(before, stages, errors):
            # An object is stored or counted, or may be stored: the others
            # settle alone. Refused whole, the batch would be split and an
            # object that may be stored made again under a new key.
            too_large = None
        for index, error in errors.items():
            if too_large is not None and is_record_rejection(error):
                continue  # the batch goes whole: counted by the shipper, or sent anew
            if is_record_rejection(error):
                # Counted in the write that acknowledges the batch (once,
                # whatever dies first); recorded as refused now.
                ctx.failed_at_ack[index] = (counts[index], error)
                stages[index] = REFUSED
            elif failure is None:
                failure = error
        if too_large is not None:
            failure = too_large if not _not_asked(before, stages, errors) else _ask_first()
        done = 0
        while done < len(stages) and stages[done] in _SETTLED:
            done += 1
        unlanded = ctx.progress.unlanded
        for index, count in swallowed.items():
            unlanded = with_unlanded(unlanded, index, count)
        ctx.save_progress(
            replace(
                ctx.progress,
                done=done,
                stages=tuple(stages),
                keys=tuple(keys),
                urls=tuple(urls),
                unlanded=unlanded,
            )
        )
        return failure

    def _expired(
        self, run_id: str, step: int, key: str, url: str
    ) -> tuple[int, str | None, str | None, BaseException | None]:
        """A URL minted on an earlier try refused (``expired_url_landed``):
        the object is done, or starts afresh, to be minted anew. Any other
        failure leaves it ``EXPIRED``: asked again on the next try."""
        refused = APIError("the presigned URL minted on an earlier try expired", status_code=403)
        nothing = expired_url_landed(lambda: self._confirm(run_id, step, key), refused)
        return (DONE, key, url, None) if nothing is None else (NEW, None, None, nothing)

    def close(self) -> None:
        self._fanout.close()


class NothingLanded(Exception):
    """The confirm of a key found nothing (400, 404) after both PUTs of its
    bytes were answered 2xx (``confirm_put_object``): ``refused`` is its answer."""

    def __init__(self, refused: APIError) -> None:
        super().__init__(str(refused))
        self.refused = refused


def confirm_put_object(confirm: Callable[[], None], put: Callable[[], None]) -> None:
    """Confirm an object whose PUT the store answered with a 2xx.

    A 2xx to a PUT proves less than it seems: a gateway in front of the
    store may answer one it never passed on. The confirm then finds no
    bytes (400, 404: not uploaded), and taking that as a refusal of the
    object's content counted the step's samples as failed though nothing
    was wrong with them. So a refused confirm puts the same bytes to the
    same URL once more (a PUT overwrites) and confirms again. Refused again,
    raises :class:`NothingLanded`: the caller mints a new key
    (``not_landed``). A transient failure of that PUT is raised (the batch
    is tried again); any other leaves the first refusal.
    """
    try:
        confirm()
    except APIError as refused:
        if not nothing_under_key(refused):
            raise  # a refusal of the content: counted at once, with its reason
        try:
            put()
        except APIError as failed:
            if is_transient(failed):
                raise
            raise refused from None
        try:
            confirm()
        except APIError as again:
            if not nothing_under_key(again):
                raise
            raise NothingLanded(again) from None


# Words of a confirm's 400 that say nothing is stored under the key (the
# local platform's "has not been uploaded"; S3's NoSuchKey; a gateway's "not
# found"), rather than what is wrong with the object stored there.
_NOTHING_THERE = (
    "not been uploaded",
    "not uploaded",
    "not found",
    "no such",
    "nosuchkey",
    "does not exist",
    "doesn't exist",
    "no object",
)


def nothing_under_key(exc: APIError) -> bool:
    """Whether a confirm's refusal ``exc`` says that nothing is stored under
    the key (a PUT a gateway swallowed, worth a PUT again and then a new key)
    rather than refusing the content stored there.

    A 404 is nothing there; so is a 400 saying so (``_NOTHING_THERE``) or
    saying nothing at all (no reason given: which one cannot be told, and
    the bounded keys of ``not_landed`` are the cheaper mistake than samples
    counted failed though they were never looked at). A 400 that names
    something else (not Parquet, past the sample table's bounds) is a verdict
    on the bytes, which any key would get again: refused at once. The
    contract leaves the confirm's wording open (§8.7), so this reads the
    code the answer carries as well as its message."""
    if exc.status_code == 404:
        return True
    if exc.status_code != 400:
        return False
    # "HTTP 400 from POST /...: <the platform's reason>" (platform.errors).
    said = str(exc).partition(": ")[2].strip().lower()
    if not said or said == "http 400":
        return True
    said = f"{exc.code or ''} {said}".replace("_", " ")
    return any(words in said for words in _NOTHING_THERE)


def not_landed(refused: APIError, step: int, keys: int) -> APIError:
    """What an object raises whose bytes ``keys`` keys in a row found missing
    (``NothingLanded``; ``refused``: the last confirm's answer): a transient
    failure, the object to be minted anew under a new key, while fewer than
    ``MINTS_UNLANDED``; then a refusal, its records counted failed with why.
    A refusal of the content never comes here (``nothing_under_key``)."""
    if keys < MINTS_UNLANDED:
        return RetryableAPIError(
            f"the object store answered 200 to both PUTs of step {step}'s object, but its "
            f"confirm found nothing under the key ({refused}); sending it again under a new key"
        )
    return ValidationRejectedError(
        f"the object store answered 200 to {2 * keys} PUTs of step {step}'s object under "
        f"{keys} keys but never stored it (the last confirm: {refused})",
        status_code=refused.status_code,
    )


def unlanded_of(unlanded: Sequence[int], index: int) -> int:
    """How many keys of the batch's object ``index`` were found empty so far."""
    return unlanded[index] if index < len(unlanded) else 0


def with_unlanded(unlanded: Sequence[int], index: int, count: int) -> tuple[int, ...]:
    """``unlanded`` with object ``index``'s count set to ``count``."""
    out = list(unlanded) + [0] * max(0, index + 1 - len(unlanded))
    out[index] = count
    return tuple(out)


def expired_url_landed(confirm: Callable[[], None], exc: APIError) -> RetryableAPIError | None:
    """The store refused (``exc``, a 403) a URL minted on an earlier try: it
    expired while the sink was paused. Its PUT may still have landed (an
    answer lost, or a batch recorded before PUTs were noted): ``confirm`` of
    its key tells. None: confirmed, the object is done. Refused as nothing
    there (``nothing_under_key``): the error to raise once the object is
    recorded as not minted, so that a new URL is minted on the next try.
    Any other failure of the confirm is raised."""
    try:
        confirm()
    except APIError as refused:
        if not nothing_under_key(refused):
            raise
        return RetryableAPIError(
            f"the object store refused the presigned URL ({exc}) and nothing landed "
            "under it; minting a new one",
            status_code=403,
        )
    return None


def _maybe_stored(
    before: Sequence[int], after: Sequence[int], errors: dict[int, BaseException]
) -> bool:
    """Whether an object of the batch may be stored though none is recorded
    done: a confirm of its key may have been sent and its answer not come
    (or come to a process that died before recording it). That is an object
    recorded ``EXPIRED`` before this stage and still so, and, once every
    object's bytes landed (the confirms' stage began, now or on an earlier
    try), any object not confirmed yet. An object refused for its content
    right now is not: a repeated confirm of a stored object is a 200."""

    def maybe(index: int, stage: int) -> bool:
        if index in errors and is_record_rejection(errors[index]):
            return False
        if stage == EXPIRED:
            return before[index] == EXPIRED  # not just found expired: asked since
        return stage == PUT and confirming

    confirming = all(stage in (PUT, *_SETTLED) for stage in before)
    return any(maybe(index, stage) for index, stage in enumerate(after))


def _not_asked(
    before: Sequence[int], after: Sequence[int], errors: dict[int, BaseException]
) -> bool:
    """Whether an object may be one a version before ``EXPIRED`` stored,
    not asked about yet. That version asked about an expired URL's object at
    once, with nothing recorded first: recorded ``MINTED`` still, it may be
    stored (that confirm committed, its answer lost). Such an object is
    known not stored once a PUT to its URL lands (a URL that expired stays
    so), and asked about once found expired (recorded ``EXPIRED`` in this
    stage): one recorded ``MINTED`` before this stage and still, its PUT not
    answered (not sent, a transient failure, or not reached: a presign's
    stage), or just found expired, is not yet. So a 413 in the same stage
    refuses the batch whole only once none is left (``_ask_first``):
    refused whole, the shipper would make its records again, under a new key."""

    def unasked(index: int, was: int, stage: int) -> bool:
        if stage == EXPIRED:
            return was != EXPIRED
        refused = index in errors and is_record_rejection(errors[index])
        return was == stage == MINTED and not refused

    return any(
        unasked(i, was, stage) for i, (was, stage) in enumerate(zip(before, after, strict=True))
    )


def _ask_first() -> RetryableAPIError:
    """What a 413 is held back as while an object recorded ``MINTED`` may be
    stored, not asked about (``_not_asked``): the asking goes on in this try, and
    the 413 comes again on the next, the batch then settled as the asking
    found it."""
    return RetryableAPIError(
        "an object of the batch is over a size limit, and one whose URL expired may be "
        "stored: asking about that one first"
    )


def _too_large(exc: BaseException) -> bool:
    """A 413: the request was over a size limit, not wrong in its content."""
    return isinstance(exc, APIError) and exc.status_code == 413
