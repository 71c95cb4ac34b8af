"""Deadlines for a client slow to send, and a bound on connections open at once.

uvicorn's h11 protocol closes a connection idle after an answer
(``timeout_keep_alive``, 5 s) and nothing else: a connection that never sent
a byte, a head sent a byte every few seconds, or a body announced by its
``Content-Length`` and never sent was held for ever (its socket, the body
read so far: up to 64 KiB before reading pauses), and any local user can
open thousands (measured: 3,000 silent ones held, +15 MiB; 500 holding 60 KB
of a body each, +30 MiB) until the process runs out of descriptors and
nobody is served. :class:`BoundedH11Protocol` gives each connection:

- a head deadline (:attr:`ConnectionLimits.head_timeout`), from the moment
  it waits for a request (accepted, or its last answer sent) to the whole
  head of one. A client writes a head at once, so only the hostile meet it;
  a byte now and then does not move it. Past it a connection that sent
  nothing is closed, as after keep-alive; one part-way through a head is
  answered 408.
- a body deadline (:attr:`ConnectionLimits.body_timeout`): the longest
  silence while a request's body is incomplete, measured between reads, so
  an upload that keeps moving is never cut however long it takes (a large
  Parquet object, a slow loop). Silence is not counted while the server is
  not reading (uvicorn pauses a body its app has not taken past 64 KiB) or
  while the client waits for a ``100 Continue`` it was not sent yet. Past it:
  408 if no answer has started, and the app is told the client left.
- a body's least rate (:data:`MIN_RATE`, 1 KiB/s), judged over windows of
  the body deadline: from its head (and again from any time the server was
  not reading it), each window must carry that rate's worth of the body, or
  408 as above; one that does starts the next. A body trickled a byte just
  within each silence held its connection for hours; averaged since the
  head, bytes sent fast early bought as long (300 KB at once, then a byte
  now and then, five minutes; 25 MiB, seven hours). A client of this
  machine or a slow link sends thousands of times faster, in every window.
- the same least rate, over the same windows, while an answer waits on its
  client: once the socket takes no more and the transport holds past its
  high-water mark (asyncio pauses the protocol's writes), or a close waits
  for what the transport holds to go out, the next answer waits for room
  only the client makes, and a pipelined one after it. What the client
  took is told by the bytes it has not (the transport's and the socket's
  send queue, :meth:`BoundedH11Protocol._unsent_bytes`), so a reader of a
  large answer at a useful rate is never cut; one that reads nothing, or
  a few hundred bytes a second (never silent for long, it held its
  connection for the hours a large answer took), has its connection
  aborted (nothing can be said to it; a close would wait for the held
  bytes to go out), and the app told its client left.
- a bound (:attr:`ConnectionLimits.max_connections`): a connection accepted
  while that many are open takes the place of the one that has waited
  longest for a request's head (kept alive between requests, silent, or
  trickling a head), which is answered 503 with ``Retry-After`` and closed:
  connections kept alive with a request every few seconds held every
  place, and each new client was turned away for as long as they liked.
  One whose last answer the socket's send queue still holds is judged as
  that answer's reader from then on: writes going, no answer's window ran,
  and a client that read none of answers the kernel took whole held its
  place, judged on nothing, up to the head's deadline.
  Where every connection has a request under way or an answer going out,
  the new one takes the place of the one making the least progress with a
  body, or with taking an answer waiting on it, if that is under
  :data:`FAIR_RATE` (64 KiB/s) since it started and has run a second
  (``_slowest``): each window at the least rate kept a place for hours, and
  a local user held every place so at 60 KiB/s all told. A body's rate is
  over the time the server waited on the connection's bodies since it
  last waited a second for a head (takeable as idle meanwhile): each
  body's own clock let requests pipelined a byte at a time, each under a
  second, hold a place at a few hundred bytes a second. The server's own
  pauses in reading a body are left out, its count going on from the first
  look after one, a read or a new connection's: left to the read, a client
  that sent 70 KB at once (reading paused) and then nothing was judged on
  nothing up to the body deadline. A body's count
  ends as the body does, the server's writes paused or not: looked at only
  with writes going, a body that ended while they were paused was counted
  on into the next, pauses and all. One begun while they were paused (its
  connection judged meanwhile on what it reads) is counted from when they
  resume: first looked at at its next read, a client silent once it had
  read its answer was judged on nothing till then. A body's bytes are
  counted from the read that brought its head: its first piece, sent with
  the head, left out, small bodies sent in pieces were judged on two thirds
  of each and let go. Its head's are not, nor a head sent with the last
  byte of the body before: 40 KB heads, each with two bytes of body over
  half a second, held a place. Each body's first tenth of a second
  (:data:`BODY_GRACE`) is not counted against it, only past it: a rate
  over a small body's few pieces is the wait between them, not the
  client's speed, and 2 KiB bodies in three pieces 25 ms apart were judged
  at 40 KB/s and let go. A rule by the body's own second, or by its bytes,
  would leave unjudged the requests pipelined a byte each half a second
  that the count over all bodies was made for; past the grace they are
  judged at under 5 B/s. Else the new one is
  answered so and closed at once, before any of its request: waiting for
  its head held its descriptor up to the head's deadline, and a thousand
  silent ones within it used all the process had (``descriptors``). A
  client whose request is still going out reads the 503 (httpx reads the
  answer when its write is refused); the SDK retries.
- a connection answered before its request's body was read (the guard's
  401 to a key refused at the head, a route's refusal of a body past its
  cap) gives way to a new one as one waiting on a head does: uvicorn reads
  the rest to drop it and keep the connection alive, and a client without
  the key held a place so, at the least rate, for as long as its
  ``Content-Length`` lasted, while every key holder was answered 503.
  Closed at once, a client still sending met a reset that lost it the
  answer, so only a new connection's need closes it. Its body's count ends
  at the answer, and only the rest's silence is timed (the body deadline,
  not the least rate: nobody waits on it, its place any new one's): its
  end and the next head come in one read, with no look between, and the
  next body went on with the refused one's count and window, judged from
  its start 30 s before at 70 B/s.
- a bound on the bytes of unfinished bodies held by all connections at
  once (:attr:`ConnectionLimits.body_memory`, 1 GiB): a route reads its
  body whole before it acts on it, so each of the bound's connections could
  hold one up to its route's cap (26 MiB; an object's 512 MiB) for as long
  as it kept sending (a window at the least rate is 60 KiB, a body's cap
  26 MiB: sent that slowly, a body holds its cap for seven hours), 13 GiB
  from 512 connections. The connection whose bytes pass the bound is answered
  503 with ``Retry-After`` (the SDK retries) and closed, the app told its
  client left; the others go on. What a transport holds of answers waiting
  on their clients (writes paused) counts against the same bound: a client
  that asked for a large answer and read none held it for a window, one
  reading at the least rate for hours, and twelve holding answers of 8 MiB
  grew the server by 470 MiB (an answer's copies on its way out, the app's
  among them, live while its writes wait). The connection whose answer
  passes the bound is aborted (its answer is under way), the app told its
  client left; what its socket had taken is the kernel's to send or drop.

One timer a connection, moved only when it fires early: a read records its
time and nothing more, so an upload's many reads arm no timer each.
"""

from __future__ import annotations

import asyncio
import fcntl
import http
import struct
import sys
import termios
from typing import ClassVar

import h11

from .guard import SECURITY_HEADERS
from .one_write import OneWriteH11Protocol
from .settings import ConnectionLimits

__all__ = [
    "BUSY_ANSWER",
    "BUSY_BODY",
    "FULL_BODY",
    "LATE_BODY",
    "BoundedH11Protocol",
    "HeldBodies",
    "Places",
    "answer_head",
]

LATE_BODY = b'{"detail": "request not received in time"}'
#: Bytes a second a body must carry, and a client take of an answer waiting
#: on it, over each window of the body deadline (a Parquet object of 5 MB
#: within 85 minutes).
MIN_RATE = 1024
BUSY_BODY = b'{"detail": "too many connections: retry"}'
#: Bytes a second under which a body (or an answer's reader) gives its
#: place to a new connection past the bound (``_slowest``): 512 places held
#: so cost 32 MiB/s all told; a client of this machine, or of a link, sends
#: many times that.
FAIR_RATE = 64 * 1024
#: Seconds of a connection's bodies (past each one's :data:`BODY_GRACE`),
#: or of an answer waiting on its client, before its progress is judged
#: against :data:`FAIR_RATE`.
JUDGED_AFTER = 1.0
#: Seconds of each body the bound does not count against it: a small body's
#: pieces come a client's timer tick or a loaded host's turn apart (10 to 50
#: ms), and a rate over a few of them is that wait, not the client's speed
#: (2 KiB bodies in three pieces 25 ms apart were judged at 40 KB/s and let
#: go). A body that ends within it adds its bytes and none of its time, so
#: is never judged slow; one meant to hold a place so must end a request
#: every tenth of a second, a load and not a slow client, while requests
#: pipelined a byte each half a second are judged at under 5 B/s.
BODY_GRACE = 0.1
#: Seconds a scan that found no connection under :data:`FAIR_RATE` holds
#: for those past the bound after it (each refused 503: retried in a second).
RESCAN_AFTER = 0.1
FULL_BODY = b'{"detail": "too many request bodies held at once: retry"}'
#: A 503's own header: the SDK waits a second and tries again.
RETRY_AFTER = (b"retry-after", b"1")


def answer_head(body: bytes, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """The headers of an answer of the server's own carrying ``body``: JSON,
    its length, closing, ``extra``, the guard's (the status line is the caller's)."""
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
        *SECURITY_HEADERS,
    ]


def _busy_answer() -> bytes:
    """The 503 a connection past the bound is sent, whole, as it is accepted."""
    head = b"".join(b"%s: %s\r\n" % pair for pair in answer_head(BUSY_BODY, RETRY_AFTER))
    return b"HTTP/1.1 503 Service Unavailable\r\n%s\r\n%s" % (head, BUSY_BODY)


BUSY_ANSWER = _busy_answer()


class HeldBodies:
    """Bytes of unfinished request bodies all of one server's connections
    hold (``BoundedH11Protocol.body_memory``'s count)."""

    def __init__(self) -> None:
        self.held = 0


class Places:
    """What one server's bound knows of its places beyond their count."""

    def __init__(self) -> None:
        #: Until when a connection past the bound is refused without a scan
        #: for one under :data:`FAIR_RATE` (``BoundedH11Protocol._slowest``):
        #: one found none that soon before.
        self.none_slow_until = 0.0


class BoundedH11Protocol(OneWriteH11Protocol):
    """uvicorn's h11 protocol (one write an answer) with the deadlines and the
    bound in the module docstring; ``limits`` is set by ``with_limits``."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    bodies: ClassVar[HeldBodies] = HeldBodies()
    places: ClassVar[Places] = Places()
    #: Connections waiting for a head (``_head_by`` set), longest first: the
    #: bound's choice is the first that fits, not a scan of every connection
    #: (at 512, a flood's accept cost the server 0.8 ms of CPU with the scan,
    #: four times one refused at once, 0.3 ms without).
    waiting: ClassVar[dict[BoundedH11Protocol, None]] = {}

    @classmethod
    def with_limits(cls, limits: ConnectionLimits) -> type[BoundedH11Protocol]:
        """This protocol with ``limits`` and a count of bodies held of its own
        (uvicorn makes it from the class)."""
        own = {"limits": limits, "bodies": HeldBodies(), "places": Places(), "waiting": {}}
        return type(cls.__name__, (cls,), own)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._head_by: float | None = None
        self._sent_from: float | None = None  # (an answer's window: None, none waits)
        self._sent_base = 0  # (what the client had taken of answers then)
        self._last_read = self.loop.time()
        self._received = 0  # (bytes, all told)
        self._body_from: float | None = None  # when the body's window started
        self._body_base = 0  # (what was received then)
        # Where the body's, and the answer's, progress is counted from (the
        # bound's choice, ``_slowest``): as their windows, but not moved on
        # as each ends at the rate.
        self._body_start, self._body_start_base = 0.0, 0
        self._sent_start, self._sent_start_base = 0.0, 0
        # Seconds the server waited on this connection's earlier bodies (and
        # of this one's before the server held it up), and the bytes they
        # brought: a body's clock alone restarted at each head, and requests
        # pipelined a byte at a time, each under JUDGED_AFTER, held a place
        # at a few hundred bytes a second.
        self._judged_time, self._judged_bytes = 0.0, 0
        self._held_up = False  # (the server not reading the body at the last look)
        self._held = 0  # (bytes of an unfinished body counted in ``bodies``)
        self._held_from: int | None = None  # (what was received when it started)
        self._held_answer = 0  # (bytes of answers waiting on the client, counted too)
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            waiting = self._longest_waiting()
            if waiting is not None:
                waiting._give_way()
            else:
                slowest = self._slowest()
                if slowest is None:
                    self.transport.write(BUSY_ANSWER)
                    self.transport.close()  # (connection_lost, a turn later, uncounts it)
                    return
                slowest._evicted()
        self._watch()

    def _longest_waiting(self) -> BoundedH11Protocol | None:
        """The connection, of those open, that has waited longest for a
        request's head with nothing of its own left to send; None if none
        does (each has a request under way, or an answer going out).

        A client sends its head at once: a connection that waits on one is
        kept alive between requests, or silent, or trickling a head. Holding
        the bound with such connections, a request every few seconds each,
        kept every new client out (answered 503) for as long as one liked.
        An answer the socket's send queue still holds is one going out (a
        client reading a large answer slowly, its next request begun): its
        503 would wait behind it, the connection open past the bound until
        the client read it all or its window ran out. One answered before
        its body ended (a key refused at the head) is read on only to drop
        the rest, and gives way as readily."""
        closing = []
        found = None
        for other in self.waiting:
            if other.transport.is_closing():
                closing.append(other)  # (for good: not looked at again)
            elif other is self:
                continue
            elif (
                other.conn.their_state is h11.IDLE
                and other.conn.our_state is h11.IDLE
                and not other.flow.write_paused
            ):
                if not other._unsent_bytes():
                    found = other
                    break
                # Its answer still in the socket's queue: judged as its reader
                # from now (``_slowest``). Writes going, no answer's window ran,
                # and a client that left a queue's worth unread held its place
                # judged on nothing, a byte of a head now and then, for as long
                # as the head's deadline.
                other._answer_waits()
            elif other.conn.our_state is h11.DONE and other.conn.their_state is h11.SEND_BODY:
                found = other
                break
        for other in closing:
            del self.waiting[other]
        return found

    def _give_way(self) -> None:
        """Close this connection, which waits on a head, for a new one past
        the bound, with a 503 (``Retry-After``): a client whose request was
        on its way reads it and retries; an idle kept-alive one is dropped
        by its client's pool, which finds it answered before it asked. Its
        state, nothing sent or asked, is the new one's: it is sent the same
        bytes, not an answer h11 builds (a flood's accept at the bound paid
        that every time). One answered before its body ended is closed (it
        has its answer)."""
        if self.conn.our_state is not h11.DONE:
            self.transport.write(BUSY_ANSWER)
        self.transport.close()
        self._watch()

    def _slowest(self) -> BoundedH11Protocol | None:
        """The connection, of those open, making the least progress with what
        it is waited on for (a body, or an answer it takes) under
        :data:`FAIR_RATE`; None if none is that slow (each is fast enough, or
        the server's to move on).

        Each window at :data:`MIN_RATE` kept a body (or an answer's reader)
        its place for hours: 512 such held every place for 60 KiB/s all
        told, and each new client was answered 503. A scan of every
        connection, paid only when none waits on a head (0.5 ms at 512), and
        once in :data:`RESCAN_AFTER` when it finds none: a flood of
        connections while every place is busy paid it for each."""
        now = self.loop.time()
        if now < self.places.none_slow_until:
            return None
        found: BoundedH11Protocol | None = None
        least = float(FAIR_RATE)
        for other in self.connections:
            if isinstance(other, BoundedH11Protocol):
                rate = other._progress(now)
                if rate is not None and rate < least:
                    found, least = other, rate
        if found is None:
            self.places.none_slow_until = now + RESCAN_AFTER
        return found

    def _progress(self, now: float) -> float | None:
        """Bytes a second this connection's client has sent of its bodies
        (over the time the server waited on them, each one's
        :data:`BODY_GRACE` left out: the module docstring says which), or
        taken of an answer waiting on it since it started; None where it is
        not judged: it waits on nobody's bytes, or on the server's, or has
        had under :data:`JUDGED_AFTER` counted (a client's first bytes come
        in bursts)."""
        if self.flow.write_paused or (self._sent_from is not None and self._unsent_bytes()):
            started, base = self._sent_start, self._sent_start_base
            if self._sent_from is None or now - started < JUDGED_AFTER:
                return None
            return (self._taken() - base) / (now - started)
        cycle = self.cycle
        if (
            self.transport.is_closing()
            or self._body_from is None
            or self.conn.their_state is not h11.SEND_BODY
            or self.flow.read_paused
            or (cycle is not None and cycle.waiting_for_100_continue)
        ):
            return None
        if self._held_up:
            # Reading resumed since the last look (the app took what was read
            # ahead), no read since: its clock restarts now, as at that read
            # (:meth:`_request_due`). Left to the read, a client silent once
            # reading resumed was judged on nothing up to the body deadline.
            self._body_start, self._body_start_base, self._held_up = now, self._received, False
        spent = self._judged_time + max(0.0, now - self._body_start - BODY_GRACE)
        if spent < JUDGED_AFTER:
            return None
        return (self._judged_bytes + self._received - self._body_start_base) / spent

    def _evicted(self) -> None:
        """Let this connection go for a new one past the bound: a body is
        answered 503 (``Retry-After``: the SDK retries), an answer under way
        cut (nothing more can be said on it); the app is told its client left."""
        if self.conn.our_state is h11.SEND_RESPONSE and not self.transport.is_closing():
            self.answer_and_close(503, BUSY_BODY, RETRY_AFTER)
        else:
            self.transport.abort()  # (connection_lost tells the app)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.waiting.pop(self, None)
        self._hold(0)
        self._hold_answer(0)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        self._received += len(data)
        super().data_received(data)
        self._count_body()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._answer_waits()
        if self._count_answer():
            self._watch()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._count_answer() and self.conn.their_state is h11.SEND_BODY:
            # A body begun while writes waited, looked at only as the reader
            # of an answer till now, is counted from here, not from its next
            # read: a client silent once it had read its answer was judged
            # by nothing until then (up to a body's deadline), and no new
            # connection past the bound could take its place. Only a body:
            # an idle connection looked at now joins those waiting on a head
            # while its client may not yet have read the answer it holds.
            self._watch()

    def handle_events(self) -> None:
        super().handle_events()
        self._watch()

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY:
            # Answered before its body was read (a key refused at the head,
            # a body past its cap): the rest, read only to be dropped, holds
            # its place no longer than a new connection's coming. uvicorn
            # reads it to keep the connection alive, at the least rate for as
            # long as its Content-Length lasted, and a client without the key
            # held a place so while every key holder was answered 503. (Not
            # closed at once: a client still sending met a reset that lost
            # it the answer.)
            self.waiting[self] = None
        super().on_response_complete()
        self._count_body()
        self._watch()

    def answer_and_close(self, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
        """Answer ``status`` with ``body`` (and ``extra`` headers) and close,
        whatever the request (none yet, a head h11 refused, a body cut short)."""
        try:
            reason = http.HTTPStatus(status).phrase.encode()
            headers = answer_head(body, *extra)
            event = h11.Response(status_code=status, headers=headers, reason=reason)
            data = (self.conn.send(event) or b"") + (self.conn.send(h11.Data(data=body)) or b"")
            data += self.conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            # An answer was already under way on this connection: nothing
            # more can be said on it, only closed.
            data = b""
        if data:
            self.transport.write(data)
        self.transport.close()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # What connection_lost will say, said before the app's next turn.
            cycle.disconnected = True
            cycle.message_event.set()

    def _count_body(self) -> None:
        """Count what this connection's unfinished body holds (from the read
        after its head) among the server's; past ``body_memory``, 503 it."""
        conn = self.conn
        held = 0
        if (
            conn.their_state is h11.SEND_BODY
            and conn.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)  # (answered: dropped)
            and not self.transport.is_closing()
        ):
            if self._held_from is None:
                self._held_from = self._received
            held = self._received - self._held_from
        else:
            self._held_from = None
        self._hold(held)
        if held and self.bodies.held > self.limits.body_memory * 2**20:
            self._hold(0)
            self.answer_and_close(503, FULL_BODY, RETRY_AFTER)

    def _count_answer(self) -> bool:
        """Count what the transport holds of answers for this client among
        the server's held bytes (:attr:`ConnectionLimits.body_memory`); past
        the bound, abort it (an answer is under way: nothing more can be said
        on it), which lets the app's copies of it go too. False if aborted.

        Counted as writes pause and resume and as its timer fires: the
        transport's bytes only fall in between, so the count is never short."""
        if self.transport.is_closing() and not self.flow.write_paused:
            self._hold_answer(0)  # (a close's rest: under asyncio's 64 KiB mark)
            return True
        self._hold_answer(self.transport.get_write_buffer_size())
        if self._held_answer and self.bodies.held > self.limits.body_memory * 2**20:
            self._hold_answer(0)
            self.transport.abort()  # (connection_lost tells the app)
            return False
        return True

    def _hold_answer(self, held: int) -> None:
        """This connection's answer waiting on its client counted as ``held`` bytes."""
        self.bodies.held += held - self._held_answer
        self._held_answer = held

    def _hold(self, held: int) -> None:
        """This connection's unfinished body counted as ``held`` bytes."""
        self.bodies.held += held - self._held
        self._held = held

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _unsent_bytes(self) -> int:
        """Bytes of answers the client has not taken: the transport's and,
        on Linux, the socket's send queue (a reader of a large answer drains
        that first, the transport's only once it has room)."""
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sys.platform == "linux" and sock is not None:
            try:
                queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
                unsent += struct.unpack("i", queued)[0]
            except OSError:
                pass
        return unsent

    def _taken(self) -> int:
        """Bytes of answers the client has taken, all told."""
        written: int = self.transport.written  # type: ignore[attr-defined]  # (HeldWrites)
        return written - self._unsent_bytes()

    def _answer_waits(self) -> None:
        """Start an answer's window, if none runs: the server holds bytes
        that wait on the client to take some (its writes paused, or a close
        that waits for them to go out)."""
        if self._sent_from is None:
            self._sent_from, self._sent_base = self.loop.time(), self._taken()
            self._sent_start, self._sent_start_base = self._sent_from, self._sent_base

    def _due(self) -> float | None:
        """When the client's time is up for what the connection waits on now
        (None: it waits on nobody's bytes, the app has the request)."""
        answer = None if self._sent_from is None else self._sent_from + self.limits.body_timeout
        if self.flow.write_paused or self.transport.is_closing():
            if self._body_from is not None and self.conn.their_state is not h11.SEND_BODY:
                # A body that ended while writes wait ends its count here, not
                # at the next look with writes going: the next body was counted
                # as going on from its start, pauses and waits in its time.
                self._body_ended()
            return answer  # (on the client to read what was written, or nothing)
        request = self._request_due()
        if answer is None or request is None:
            return request if answer is None else answer
        return min(answer, request)

    def _request_due(self) -> float | None:
        """:meth:`_due` for what the client sends: a head, or a body."""
        state = self.conn.their_state
        if state is not h11.SEND_BODY and self._body_from is not None:
            self._body_ended()
        if state is h11.IDLE:
            if self._head_by is None:
                self._head_by = self.loop.time() + self.limits.head_timeout
                self.waiting[self] = None  # (the last to start waiting)
            return self._head_by
        if self._head_by is not None:
            if self.loop.time() - self._head_by + self.limits.head_timeout >= JUDGED_AFTER:
                # It waited a second for this head, any new connection's to
                # take as idle: its earlier bodies weigh on it no more.
                self._judged_time, self._judged_bytes = 0.0, 0
            self._head_by = None  # (a head arrived: the next one's time starts after its answer)
            self.waiting.pop(self, None)
        if state is h11.SEND_BODY:
            cycle = self.cycle
            if cycle is not None and cycle.response_complete:
                # Answered before it ended (a key refused at its head): the
                # rest is read only to be dropped, its connection any new
                # one's to take meanwhile. Its count ends at the answer, and
                # only its silence is timed: counted on, the next request's
                # body, its head come with the rest's end (one read, no look
                # between), went on with this one's count and window.
                if self._body_from is not None:
                    self._body_ended()
                return self._last_read + self.limits.body_timeout
            now = self.loop.time()
            held_up = self.flow.read_paused or (
                cycle is not None and cycle.waiting_for_100_continue
            )
            if held_up and not self._held_up and self._body_from is not None:
                self._judge_until(now)  # (the server's pause is not the client's time)
            starts = self._body_from is None
            if self._body_from is None or held_up:
                # The body starts, or the server is not reading it: neither
                # a silence of the client's nor time its rate is counted on.
                self._last_read = now
                self._body_from, self._body_base = now, self._received
            if starts or held_up or self._held_up:
                # Its progress is counted from now: after a pause, from the
                # first read after it; at its start, with the body's bytes
                # the read that brought its head brought (h11 has given them
                # all to the cycle, which the app has not yet run to take,
                # and they follow the head). Left out, a small body's
                # first piece was: a client sending 2 KiB bodies in three
                # pieces 12 ms apart, its head with the first, was judged on
                # two thirds of each, under FAIR_RATE, and let go for a new
                # connection. Not the head's: 40 KB heads, each with two
                # bytes of body over half a second, held a place at 80 KB/s.
                base = self._received
                if starts and not held_up and cycle is not None:
                    base = self._received - len(cycle.body)
                self._body_start, self._body_start_base = now, base
            self._held_up = held_up
            window_end = self._body_from + self.limits.body_timeout
            return min(self._last_read + self.limits.body_timeout, window_end)
        return None

    def _body_ended(self) -> None:
        """Count the body that ended (unless the server held it up last) and
        let the next body's window start at its head."""
        if not self._held_up:
            self._judge_until(self.loop.time())
        self._body_from = None

    def _judge_until(self, now: float) -> None:
        """Count the body's time the server waited on its client, up to
        ``now``, and what it brought, among the connection's (``_progress``)."""
        # Up to the body's end: what h11 holds past it is the next request's
        # (pipelined, sent with the body's last byte), and a 40 KB head sent
        # so with each body of two bytes held a place at 80 KB/s.
        received = self._received - len(self.conn.trailing_data[0])
        spent = now - self._body_start - BODY_GRACE  # (:data:`BODY_GRACE`)
        if spent > 0:
            self._judged_time += spent
        self._judged_bytes += received - self._body_start_base

    def _watch(self) -> None:
        """Arm the timer for :meth:`_due` if none is set by then. One set
        later is moved earlier; one set earlier is left to fire and look
        again, as one is while the app has the request: a kept-alive
        connection's requests then arm a timer a deadline, not one each.
        A closing connection is let be, unless what it holds does not go
        out (a close waits for it)."""
        if self._sent_from is not None:  # (a call less for each request that waits on none)
            self._answers_taken()
        if self.transport.is_closing() and not self.flow.write_paused:
            if self.transport.get_write_buffer_size() == 0:
                self._disarm()
                return
            self._answer_waits()
        due = self._due()
        if due is None:
            return
        if self._timer is None or due < self._timer_at:
            self._disarm()
            self._timer_at = due
            self._timer = self.loop.call_at(due, self._expired)

    def _answers_taken(self) -> None:
        """End the answer's window once nothing the server holds waits on the
        client (writes not paused, nothing buffered nor in the socket's send
        queue, where a client's unread answers wait too): the next answer's window
        and progress start afresh. Left to the timer (up to a head's deadline
        later), a kept-alive client's next large answer was judged over the
        wait between them and the app's work on it, and one reading it at
        once could fall under FAIR_RATE and be aborted."""
        if self._sent_from is not None and not self.flow.write_paused and not self._unsent_bytes():
            self._sent_from = None

    def _slid(self, now: float) -> None:
        """Windows that ended at the rate start again from ``now``: an
        answer's (or none, once nothing held waits on the client) and a
        body's. One that ended short of it is left ended (:meth:`_due`)."""
        window = self.limits.body_timeout
        self._answers_taken()
        if self._sent_from is not None and now >= self._sent_from + window:
            taken = self._taken()
            if taken - self._sent_base >= MIN_RATE * (now - self._sent_from):
                self._sent_from, self._sent_base = now, taken
        if (
            self._body_from is not None
            and self.conn.their_state is h11.SEND_BODY
            and now >= self._body_from + window
            and self._received - self._body_base >= MIN_RATE * (now - self._body_from)
        ):
            self._body_from, self._body_base = now, self._received

    def _expired(self) -> None:
        self._timer = None
        now = self.loop.time()
        if self._held_answer and not self._count_answer():
            return  # (aborted: past the bound; what it took since is no longer counted)
        self._slid(now)
        if self._sent_from is not None and now >= self._sent_from + self.limits.body_timeout:
            self.transport.abort()  # (connection_lost tells the app)
            return
        if self.transport.is_closing() and self._sent_from is None:
            return
        due = self._due()
        if due is None:
            return
        if now < due:  # bytes came or went since it was armed
            self._watch()
            return
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self.transport.close()  # nothing of a request: an idle connection
        else:
            self.answer_and_close(408, LATE_BODY)
        self._watch()  # (a close waits for what the client does not read)
