"""Fuzz ``primeruns.records.encode_record`` over arbitrary nested values.

The fuzzer's bytes are decoded into a nested value (dicts with odd keys, lists,
tuples, sets, NaN and huge ints, invalid Unicode, bytes, enums, dataclasses,
dates, Decimals, plain objects, deep nesting). Each value must either encode to
strict JSON (no NaN, valid UTF-8) or raise ``RecordEncodeError``; a value built
only of JSON-native parts must also come back unchanged. Anything else (another
exception, a crash, a hang) is a finding.

Run (atheris is a dev tool, not a dependency of the project)::

    pip install atheris
    python fuzz/encode_record.py -atheris_runs=200000          # a bounded run
    python fuzz/encode_record.py -max_total_time=600 corpus/   # keep a corpus

Any libFuzzer flag works (``-help=1`` lists them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import sys
import uuid
import warnings
from decimal import Decimal
from typing import Any

import atheris

with atheris.instrument_imports():
    from primeruns.records import RecordEncodeError, RecordRepairWarning, encode_record


class Shade(enum.Enum):
    DARK = "dark"
    LIGHT = 2


@dataclasses.dataclass
class Pair:
    left: Any
    right: Any


class Opaque:
    pass


class Builder:
    """Turns fuzzer bytes into a value, noting whether it is JSON-native."""

    def __init__(self, data: bytes) -> None:
        self.fdp = atheris.FuzzedDataProvider(data)
        self.native = True  # JSON-native and free of NaN, surrogates, big ints

    def value(self, depth: int) -> Any:
        if depth > 300 or self.fdp.remaining_bytes() == 0:
            return None
        kind = self.fdp.ConsumeIntInRange(0, 19)
        if kind == 0:
            return {self.key(): self.value(depth + 1) for _ in range(self.count())}
        if kind == 1:
            return [self.value(depth + 1) for _ in range(self.count())]
        if kind == 2:
            return self.fdp.ConsumeBool()
        if kind == 3:
            return self.fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
        if kind == 4:
            return self.fdp.ConsumeRegularFloat()
        if kind == 5:
            return self.fdp.ConsumeUnicodeNoSurrogates(12)
        if kind == 6:
            self.native = False
            return self.fdp.ConsumeUnicode(12)  # may hold lone surrogates
        if kind == 7:
            self.native = False
            return self.fdp.ConsumeFloat()  # NaN and infinities too
        if kind == 8:
            self.native = False
            return self.fdp.ConsumeInt(16)  # up to 128 bits
        if kind == 9:
            self.native = False
            return tuple(self.value(depth + 1) for _ in range(self.count()))
        if kind == 10:
            self.native = False
            return {self.fdp.ConsumeIntInRange(-5, 5) for _ in range(self.count())}
        if kind == 11:
            self.native = False
            return self.fdp.ConsumeBytes(4)
        if kind == 12:
            self.native = False
            return Shade.DARK if self.fdp.ConsumeBool() else Shade.LIGHT
        if kind == 13:
            self.native = False
            return Pair(self.value(depth + 1), self.value(depth + 1))
        if kind == 14:
            self.native = False
            seconds = self.fdp.ConsumeIntInRange(0, 10**8)
            return dt.datetime(2024, 1, 1) + dt.timedelta(seconds=seconds)
        if kind == 15:
            self.native = False
            finite = Decimal(self.fdp.ConsumeIntInRange(-(10**6), 10**6))
            choices = [finite.scaleb(-3), Decimal("NaN"), Decimal("sNaN"), Decimal("-Infinity")]
            return choices[self.fdp.ConsumeIntInRange(0, 3)]
        if kind == 16:
            self.native = False
            return uuid.UUID(int=self.fdp.ConsumeIntInRange(0, 2**64))
        if kind == 17:
            self.native = False
            return Opaque()
        if kind == 18:
            self.native = False
            return {self.fdp.ConsumeIntInRange(0, 3): self.value(depth + 1)}
        # Deep nesting: near and beyond the encoder's limit.
        inner: Any = self.value(depth + 1)
        for _ in range(self.fdp.ConsumeIntInRange(0, 300)):
            inner = [inner]
        return inner

    def key(self) -> str:
        return str(self.fdp.ConsumeUnicodeNoSurrogates(6))

    def count(self) -> int:
        return int(self.fdp.ConsumeIntInRange(0, 4))


def _refuse(constant: str) -> Any:
    raise AssertionError(f"encoder emitted {constant}")


def test_one_input(data: bytes) -> None:
    builder = Builder(data)
    value = {"value": builder.value(0)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordRepairWarning)
        try:
            payload = encode_record(value, what="fuzz")
        except RecordEncodeError as error:
            assert error.path.startswith("fuzz"), error.path
            return
    decoded = json.loads(payload.decode("utf-8"), parse_constant=_refuse)
    if builder.native and not _too_deep(value):
        assert decoded == value or _has_nan(value), (value, decoded)


def _too_deep(value: Any, depth: int = 0) -> bool:
    if depth > 250:
        return True
    if isinstance(value, dict):
        return any(_too_deep(item, depth + 1) for item in value.values())
    if isinstance(value, list):
        return any(_too_deep(item, depth + 1) for item in value)
    return False


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_nan(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_nan(item) for item in value)
    return False


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
