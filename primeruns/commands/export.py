"""``primeruns export RUN``: a journal's records as JSONL (or metrics as Parquet).

No platform needed: records are read from the journal as the producer logged
them (after the SDK's encoding), one JSON object a line, in log order. Written
files are 0600: they hold the user's data.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any, BinaryIO

from ..journal import Damage, Journal
from ..reports import KIND_NAMES, iter_entries, iter_rows
from .common import (
    EXIT_DAMAGED,
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    add_runs_dir,
    inert_errors,
    resolve_run,
    runs_dir_of,
)
from .console import inert

__all__ = ["add_parser"]


def _open_private(path: str) -> BinaryIO:
    """``path`` for writing, a 0600 file of ours.

    ``-o /tmp/NAME`` is a shared scratch disk: another user may have put a
    link to one of our files at NAME (which was then truncated and filled)
    or a file of theirs open to all (which then held our records for them to
    read), or a hard link to one of ours (where ``protected_hardlinks`` is
    off). A link is followed only if nobody else could have put it there
    (ours, or in a folder only its owner writes: ``/dev/stdout``), as Linux's
    ``protected_symlinks`` does, and a file written only if it is ours and
    has no other name (made 0600 if it was not). Nor is another user's named
    pipe written into (its owner reads the records off it: where
    ``protected_fifos`` is off, or in a folder that is not sticky): what is
    not a regular file must be ours or root's (``/dev/null``, a terminal, a
    pipe to ``gzip``). It is opened without blocking, so that another's pipe
    nobody reads is a refusal, not a wait for ever; one of the user's own is
    then waited on, as they asked.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    if not _trusted_link(path):
        # Not a link to follow: none is, should one appear meanwhile.
        flags |= os.O_NOFOLLOW
    try:
        fd = _open_for_writing(path, flags)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise CommandError(f"{path} is another user's symbolic link; not written through") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) and found.st_uid not in (os.geteuid(), 0):
            raise CommandError(_not_ours(path, found))
        os.set_blocking(fd, True)
        if stat.S_ISREG(found.st_mode):
            if found.st_uid != os.geteuid():
                owner = found.st_uid
                raise CommandError(f"{path} is another user's file (uid {owner}); not written")
            if found.st_nlink > 1:  # a hard link to one of ours, planted there
                raise CommandError(f"{path} has other names (hard links); not written")
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "wb")


def _open_for_writing(path: str, flags: int) -> int:
    """``os.open`` of ``path`` without waiting on a named pipe nobody reads,
    unless the pipe is the user's own (CommandError for another's)."""
    try:
        return os.open(path, flags | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # (a named pipe with no reader)
            raise
    found = os.stat(path, follow_symlinks=not flags & os.O_NOFOLLOW)
    if found.st_uid != os.geteuid():
        raise CommandError(_not_ours(path, found))
    return os.open(path, flags, 0o600)


def _not_ours(path: str, found: os.stat_result) -> str:
    kind = "named pipe" if stat.S_ISFIFO(found.st_mode) else "special file"
    return f"{path} is another user's {kind} (uid {found.st_uid}); not written"


def _trusted_link(path: str) -> bool:
    """Whether ``path`` is a link that no other user could have put there."""
    try:
        link = os.lstat(path)
        folder = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    if not stat.S_ISLNK(link.st_mode):
        return False
    others_write = folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return link.st_uid == os.geteuid() or (not others_write and link.st_uid == folder.st_uid)


#: A Parquet export converts its rows to columns a batch at a time: a
#: 100,000-step run's rows held at once as Python objects are hundreds of MB,
#: its columns a few. Bounded in bytes too, for rows far larger than a
#: training step's scalars.
_BATCH_ROWS = 5_000
_BATCH_BYTES = 16 << 20


def _row_batches(journal: Journal, damage: list[Damage]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    size = 0
    for entry, row in iter_rows(journal, KIND_NAMES["metrics"], damage):
        batch.append(row)
        size += len(entry.payload)
        if len(batch) >= _BATCH_ROWS or size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _write_parquet(journal: Journal, target: str, damage: list[Damage]) -> int:
    """The metric rows as one Parquet table. Its columns are every row's,
    not the first's (a metric logged every 100 steps, an evaluation's row
    beside the training one): an int that becomes a float is a float
    column, a group that gains a field gains it; a metric whose rows
    disagree on its type (a float, then a string), a number past 64
    bits, or a group with no field, no column holds, and the export is
    refused with no file."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise CommandError(
            "Parquet output needs pyarrow: pip install 'prime-runs[train]' (or use .jsonl)"
        ) from None
    try:
        # Each batch's columns are every one of its rows' (``pa.array`` of
        # the dicts; ``Table.from_pylist`` would take the first row's).
        parts = [pa.Table.from_struct_array(pa.array(b)) for b in _row_batches(journal, damage)]
        try:
            schema = (
                pa.unify_schemas([p.schema for p in parts], promote_options="permissive")
                if parts
                else pa.schema([])
            )
        except pa.ArrowTypeError:
            # Batches whose types disagree where one conversion of every row
            # does not (Arrow takes a bool among floats as a float, but a
            # batch of bools alone as bools): converted again, all at once,
            # so the batches never decide what is written. Rare (a metric
            # that changed type mid-run); it then holds every row at once.
            whole = pa.array([row for part in parts for row in part.to_pylist()])
            parts = [pa.Table.from_struct_array(whole)]
            schema = parts[0].schema
        # A batch missing a column, or holding an int column another holds
        # as floats, is converted again under the run's schema (casting a
        # group that lacks a field needs a newer pyarrow than the floor).
        parts = [
            p if p.schema.equals(schema) else pa.Table.from_pylist(p.to_pylist(), schema=schema)
            for p in parts
        ]
        # Some columns Arrow holds Parquet does not (a group with no field in
        # any row, ``{"opt": {}}``): the writer refuses the schema as it
        # starts, so it starts here first, before the target is opened (a
        # refusal there was a traceback and an empty file named like an export).
        pq.ParquetWriter(pa.BufferOutputStream(), schema).close()
    except (pa.ArrowException, OverflowError) as exc:
        # JSONL holds anything.
        raise CommandError(
            f"the metric rows cannot be written as Parquet ({exc}); write JSONL (-o FILE.jsonl)",
            EXIT_FAILED,
        ) from None
    rows = sum(int(p.num_rows) for p in parts)
    if rows and not len(schema):
        # Rows none of which holds a metric (``{}``): a Parquet file of no
        # column holds no row either, and would read back empty.
        raise CommandError(
            f"the {rows} metric rows hold no metric, which Parquet cannot write; "
            "write JSONL (-o FILE.jsonl)",
            EXIT_FAILED,
        )
    with _open_private(target) as handle:
        with pq.ParquetWriter(handle, schema) as writer:
            for part in parts:
                writer.write_table(part)
    return rows


def run_export(args: argparse.Namespace) -> int:
    """Write a run's records (episodes, traces or metrics) as JSONL to stdout or
    -o FILE; metrics as Parquet when FILE ends with .parquet. Damaged entries
    are skipped and reported on stderr (exit 4)."""
    path = resolve_run(args.run, runs_dir_of(args))
    parquet = bool(args.output and args.output.endswith(".parquet"))
    if parquet and args.kind != "metrics":
        raise CommandError("only --kind metrics can be written as Parquet; use .jsonl")
    damage: list[Damage] = []
    with Journal.open(path, owner=False) as journal:
        # A journal rebuilt from its intact pages on open is damaged even when
        # every entry that survived reads cleanly.
        damage.extend(journal.structural_damage())
        if parquet:
            count = _write_parquet(journal, args.output, damage)
        else:
            with ExitStack() as stack:
                out: BinaryIO = (
                    stack.enter_context(_open_private(args.output))
                    if args.output
                    else sys.stdout.buffer
                )
                count = 0
                for entry in iter_entries(journal, KIND_NAMES[args.kind], damage):
                    out.write(entry.payload)
                    out.write(b"\n")
                    count += 1
                out.flush()
    if args.output:
        print(f"wrote {count} {args.kind} records to {inert(args.output)}", file=sys.stderr)
    for d in damage:
        print(f"skipped damaged: {inert(d.what)}", file=sys.stderr)
    return EXIT_DAMAGED if damage else EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "export", help="write a run's records as JSONL or Parquet", description=run_export.__doc__
    )
    parser.add_argument("run", metavar="RUN", help="a journal directory or a local run id")
    add_runs_dir(parser)
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    parser.add_argument(
        "--kind",
        choices=sorted(KIND_NAMES),
        default="episodes",
        help="which records (default: episodes)",
    )
    parser.set_defaults(handler=inert_errors(run_export))
