"""Bounded work on the training sample table's Parquet objects.

An object is untrusted: a small file can decode to an enormous table (zstd
shrinks a long value to nothing; a dictionary or ``DELTA_BYTE_ARRAY`` column
stores a value once and repeats it per row for free). Two sides bound it:

- **confirm** (:func:`checked_rows`) refuses an object past
  :data:`MAX_OBJECT_ROWS` rows, :data:`MAX_OBJECT_DECODED_BYTES` decoded
  bytes (first by rows x the longest value its pages can hold, from the
  file's size and a codec of bounded ratio, whatever the encoding: none of
  the footer's byte sizes is trusted, a crafted footer may understate them;
  then, for what that does not bound, by decoding it in small batches and
  stopping at the cap, never whole), or
  with a nested column (a list's one row could repeat a dictionary value
  without bound, so a batch of rows would not bound a batch's size).
- **reads** decode only what they show: a page of rows
  (:func:`read_rows`, skipping whole objects and row groups by their row
  counts and decoding the rest in small batches), a column's histogram
  (:func:`column_histogram`, that column only, a batch at a time).

Why the caps are safe for honest objects: the SDK writes one object per step
(``projection.episodes_to_parquet_bytes``): one flat row per sample of that
step's episodes, typically a few to a few thousand rows and a few MiB. A
million rows, or a GiB decoded, is hundreds of times that; the trainer would
have held that step's rows as Python dicts (several times the decoded size)
to write it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import PlatformError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    import pyarrow.parquet

#: Most rows an object may hold (an SDK object is one step's samples).
MAX_OBJECT_ROWS = 1_000_000
#: Most bytes an object may decode to (Arrow's buffers, as a read holds them).
MAX_OBJECT_DECODED_BYTES = 1024 * 1024 * 1024
#: Most columns an object may have (the SDK's schema has 19), and column
#: chunks (columns x row groups; the SDK writes one row group): the checks
#: below walk every chunk's metadata.
MAX_OBJECT_COLUMNS = 1024
MAX_OBJECT_CHUNKS = 65536
#: About what one batch decoded while measuring may hold (see _measure_rows).
BATCH_BYTES = 16 * 1024 * 1024
MAX_BATCH_ROWS = 4096
#: Rows a read decodes at once: a page's rows, or this many when it reads
#: all of them; a numeric column alone (the distributions) 64 Ki at a time.
READ_BATCH_ROWS = 1024
COLUMN_BATCH_ROWS = 65536

_FIXED_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
#: Encodings whose uncompressed bytes hold every value whole (plus levels).
_WHOLE = {"PLAIN", "DELTA_LENGTH_BYTE_ARRAY", "RLE", "BIT_PACKED"}


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PlatformError(
            501, "reading a step's samples needs pyarrow: pip install 'prime-runs[train]'"
        ) from None
    return pq


def _value_bound(column: Any) -> int:
    """The most one value of a flat column chunk can decode to.

    A fixed-width value is its width; a byte array is at most its chunk's
    uncompressed bytes (a dictionary entry is in its dictionary page; a
    ``DELTA_BYTE_ARRAY`` value is a prefix of the previous value plus its own
    suffix, so no longer than all the suffixes), plus an offset."""
    width = _FIXED_WIDTH.get(column.physical_type)
    if width is not None:
        return width
    return int(column.total_uncompressed_size) + 8


def _measure_rows(meta: Any, dictionary: set[str]) -> int:
    """Rows per batch while measuring, so a batch holds about BATCH_BYTES.

    Only a column neither whole (its chunk's uncompressed bytes hold every
    value, so any batch of it is at most that, under the cap) nor read as a
    dictionary can grow a batch past its bytes (a ``DELTA_BYTE_ARRAY`` value
    repeated); per row it costs at most :func:`_value_bound`."""
    bound = 0
    for c in range(meta.num_columns):
        if meta.schema.column(c).path in dictionary:
            continue
        chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups)]
        if all(_whole(chunk) or chunk.physical_type in _FIXED_WIDTH for chunk in chunks):
            continue
        bound += max((_value_bound(chunk) for chunk in chunks), default=0)
    return max(1, min(MAX_BATCH_ROWS, BATCH_BYTES // max(bound, 1)))


def _whole(chunk: Any) -> bool:
    return set(chunk.encodings) <= _WHOLE and not chunk.has_dictionary_page


#: Most bytes one compressed byte of a codec can decompress to: none; snappy
#: at best encodes a 64-byte copy in 3 bytes. The other codecs (zstd, gzip,
#: brotli, lz4) compress a long run far more, so they get no such bound.
_RATIO = {"UNCOMPRESSED": 1, "SNAPPY": 22}


#: Each row group's row count and its column chunks' metadata (``_chunks``).
Chunks = list[tuple[int, list[Any]]]


def _chunks(meta: Any) -> Chunks:
    """Each row group's rows and column chunks, made once for every check:
    ``row_group(g).column(c)`` builds a new object each call (~0.7 us), and
    the checks of an SDK object's 19 chunks built them twice (a fifth of
    what confirming it cost on top of parsing its footer)."""
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    columns = range(meta.num_columns)
    return [(int(group.num_rows), [group.column(c) for c in columns]) for group in groups]


def _size_bound(chunks: Chunks, size: int) -> int | None:
    """A bound on the decoded size that trusts none of the footer's sizes
    (only its row counts, which the reader goes by, and its codecs, which it
    decompresses with), or None when a chunk's codec has no bounded ratio.

    Every page a chunk's reader decompresses lies in the file, so its pages
    decompress to at most ``ratio x size`` bytes, and no value it decodes is
    longer: a plain value lies in a page, a dictionary entry in the
    dictionary page, a ``DELTA_BYTE_ARRAY`` value is at most all the
    suffixes. Each of the chunk's values is one such value (an index can
    repeat an entry per row, but a row still holds one), so rows x (longest
    value + offset + validity) bounds it. An SDK object is a few snappy rows:
    this proves it small without decoding it."""
    total = 0
    for rows, columns in chunks:
        for column in columns:
            values = max(rows, int(column.num_values))
            if column.physical_type in _FIXED_WIDTH:
                # A decimal stored as an integer decodes to Arrow's 16 or 32 bytes.
                total += values * (32 + 1)
                continue
            ratio = _RATIO.get(column.compression)
            if ratio is None:
                return None
            total += values * (ratio * size + 9) + 1024  # + a batch's buffers' padding
    return total


def _refuse(key: str, why: str) -> PlatformError:
    return PlatformError(400, f"Object {key} is refused: {why}")


def _text(kind: Any) -> bool:
    import pyarrow.types as pt

    return bool(
        pt.is_string(kind)
        or pt.is_large_string(kind)
        or pt.is_binary(kind)
        or pt.is_large_binary(kind)
    )


def _measure(source: Any, meta: Any, key: str) -> None:
    """Refuse the object once it decodes past the cap, counted a batch at a
    time. A column with a dictionary page is read as a dictionary (its
    indices and its entries, never its values repeated per row) and counted
    as the values it stands for; the rest decode in batches of
    :func:`_measure_rows`, so what is held at once stays about BATCH_BYTES."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pq = _pq()
    cap = f"MAX_OBJECT_DECODED_BYTES={MAX_OBJECT_DECODED_BYTES}"
    decoded = 0
    try:
        arrow = meta.schema.to_arrow_schema()
        text = {f.name for f in arrow if _text(f.type)}
        dictionary = {
            meta.schema.column(c).path
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
            if meta.row_group(g).column(c).has_dictionary_page
            and meta.schema.column(c).path in text
        }
        parquet = pq.ParquetFile(source, metadata=meta, read_dictionary=sorted(dictionary))
        rows = _measure_rows(meta, dictionary)
        for batch in parquet.iter_batches(batch_size=rows, use_threads=False):
            for values in batch.columns:
                if pa.types.is_dictionary(values.type) and _text(values.type.value_type):
                    lengths = pc.binary_length(values.dictionary)
                    used = pc.sum(pc.take(lengths, values.indices)).as_py() or 0
                    decoded += used + 5 * len(values)  # + offsets and validity
                else:
                    decoded += values.get_total_buffer_size()
            if decoded > MAX_OBJECT_DECODED_BYTES:
                raise _refuse(key, f"it decodes to more than {cap}")
    except PlatformError:
        raise
    except Exception:
        raise PlatformError(400, f"Object {key} is not a readable Parquet file") from None


def footer_bytes(path: Path) -> int | None:
    """The length of the object's footer as its last 8 bytes give it (what
    parsing its metadata costs), or None for a file that does not end as
    Parquet does."""
    try:
        with path.open("rb") as f:
            f.seek(-8, 2)
            tail = f.read(8)
    except OSError:
        return None
    if len(tail) != 8 or tail[4:] != b"PAR1":
        return None
    return int.from_bytes(tail[:4], "little")


def checked_rows(path: Path, key: str, *, measure: bool = True) -> int | None:
    """The object's row count once it is within the bounds; a 400 naming the
    bound it passes, or that it is not a readable Parquet file. With
    ``measure`` False, None for an object only decoding it can bound: it is
    then measured by a call that may take its time (off an event loop)."""
    import pyarrow as pa

    pq = _pq()
    try:
        # One handle for the footer, the size that bounds it and any measuring,
        # so all three are of the same file (a PUT may rename another over the
        # path meanwhile), and the footer is parsed once.
        source = pa.OSFile(str(path))
    except Exception:
        raise PlatformError(400, f"Object {key} is not a readable Parquet file") from None
    with source:
        try:
            size = source.size()
            meta = pq.read_metadata(source)
        except Exception:  # any malformed file: pyarrow raises several unrelated types
            raise PlatformError(400, f"Object {key} is not a readable Parquet file") from None
        return _checked_rows(source, size, meta, key, measure)


def _checked_rows(source: Any, size: int, meta: Any, key: str, measure: bool) -> int | None:
    in_groups = sum(int(meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
    if in_groups != meta.num_rows:  # a reader goes by the groups', a count by the file's
        raise PlatformError(400, f"Object {key} is not a readable Parquet file")
    if meta.num_rows > MAX_OBJECT_ROWS:
        raise _refuse(key, f"{meta.num_rows} rows, more than MAX_OBJECT_ROWS={MAX_OBJECT_ROWS}")
    if meta.num_columns > MAX_OBJECT_COLUMNS:
        raise _refuse(
            key, f"{meta.num_columns} columns, more than MAX_OBJECT_COLUMNS={MAX_OBJECT_COLUMNS}"
        )
    chunks = meta.num_columns * meta.num_row_groups
    if chunks > MAX_OBJECT_CHUNKS:
        raise _refuse(
            key, f"{chunks} column chunks, more than MAX_OBJECT_CHUNKS={MAX_OBJECT_CHUNKS}"
        )
    schema = meta.schema  # a new object each time it is asked for, as a chunk is
    nested = [
        column.path
        for column in (schema.column(c) for c in range(meta.num_columns))
        if column.max_repetition_level > 0
    ]
    if nested:
        raise _refuse(key, f"nested column {nested[0]!r}; the sample table is flat")
    groups = _chunks(meta)
    uncompressed = sum(
        int(column.total_uncompressed_size) for _, columns in groups for column in columns
    )
    cap = f"MAX_OBJECT_DECODED_BYTES={MAX_OBJECT_DECODED_BYTES}"
    if uncompressed > MAX_OBJECT_DECODED_BYTES:
        raise _refuse(key, f"{uncompressed} bytes uncompressed, more than {cap}")
    proven = _size_bound(groups, size)
    if proven is not None and proven <= MAX_OBJECT_DECODED_BYTES:
        return int(meta.num_rows)  # an SDK object: nothing to decode
    if not measure:
        return None
    _measure(source, meta, key)
    return int(meta.num_rows)


def _batches(
    parquet: pyarrow.parquet.ParquetFile,
    start: int,
    rows: int,
    columns: Sequence[str] | None = None,
) -> Iterator[pyarrow.RecordBatch]:
    """The object's rows from ``start`` on, ``rows`` at a time; row groups
    wholly before ``start`` are never read."""
    meta = parquet.metadata
    groups: list[int] = []
    skip = start
    for g in range(meta.num_row_groups):
        in_group = meta.row_group(g).num_rows
        if not groups and skip >= in_group:
            skip -= in_group
            continue
        groups.append(g)
    if not groups:
        return
    for batch in parquet.iter_batches(
        batch_size=rows, row_groups=groups, columns=columns, use_threads=False
    ):
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        yield batch.slice(skip) if skip else batch
        skip = 0


def read_rows(
    objects: Sequence[tuple[Path, int | None]], offset: int, limit: int | None
) -> tuple[list[dict[str, Any]], int]:
    """Rows ``[offset, offset + limit)`` of the objects' rows in order, and
    their total. ``objects`` are (path, row count as confirmed; None reads
    it from the footer). Objects and row groups before the page are skipped
    by their row counts; rows before it in its first row group are decoded a
    page at a time and dropped (never made Python objects); only the page's
    rows are converted."""
    pq = _pq()
    counts = [
        rows if rows is not None else int(pq.read_metadata(path).num_rows) for path, rows in objects
    ]
    total = sum(counts)
    end = total if limit is None else min(total, offset + limit)
    shown: list[dict[str, Any]] = []
    first = 0  # the first row of the current object
    for (path, _), rows in zip(objects, counts, strict=True):
        if first + rows <= offset or first >= end:
            first += rows
            continue
        want = min(end, first + rows) - max(offset, first)
        start = max(0, offset - first)
        size = READ_BATCH_ROWS if limit is None else max(1, limit)
        for batch in _batches(pq.ParquetFile(path), start, size):
            got = batch.slice(0, want).to_pylist()
            want -= len(got)
            shown += got
            if want <= 0:
                break
        first += rows
    return shown, total


_NUMERIC = ("is_integer", "is_floating", "is_boolean")


def column_values(path: Path, column: str) -> Iterator[pyarrow.Array]:
    """The column's numeric values as float64, a batch at a time (nothing for
    an object without the column or with a non-numeric one)."""
    import pyarrow as pa
    import pyarrow.types as pt

    parquet = _pq().ParquetFile(path)
    schema = parquet.schema_arrow
    if column not in schema.names:
        return
    kind = schema.field(column).type
    if not any(getattr(pt, test)(kind) for test in _NUMERIC):
        return
    for batch in _batches(parquet, 0, COLUMN_BATCH_ROWS, columns=[column]):
        values = batch.column(0)
        yield values.cast(pa.float64(), safe=False)


def column_histogram(paths: Sequence[Path], column: str, bins: int) -> list[dict[str, Any]]:
    """``rft_reads.histogram`` of the column over the objects, computed a
    batch at a time: the same bins, in the same float arithmetic."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def finite(values: pa.Array) -> pa.Array:
        return values.filter(pc.is_finite(values))  # drops nulls, NaN and infinities

    low = high = math.nan
    count = 0
    for path in paths:
        for values in column_values(path, column):
            kept = finite(values)
            if len(kept):
                least, most = pc.min_max(kept).values()
                low = least.as_py() if not count else min(low, least.as_py())
                high = most.as_py() if not count else max(high, most.as_py())
                count += len(kept)
    if not count:
        return []
    if low == high:
        return [{"min": low, "max": high, "count": count}]
    width = (high - low) / bins
    counts = [0] * bins
    for path in paths:
        for values in column_values(path, column):
            kept = finite(values)
            if not len(kept):
                continue
            index = pc.cast(pc.floor(pc.divide(pc.subtract(kept, low), width)), pa.int64())
            index = pc.min_element_wise(index, bins - 1)
            for found in pc.value_counts(index).to_pylist():
                counts[found["values"]] += found["counts"]
    return [
        {"min": low + i * width, "max": low + (i + 1) * width, "count": n}
        for i, n in enumerate(counts)
    ]
