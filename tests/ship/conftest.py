"""What the shipping tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from primeruns.journal import Journal, ReadResult


@pytest.fixture
def count_reads() -> Callable[[Journal], list[int]]:
    """Patches a journal's ``read``: the list of the entries each call returned."""

    def patch(journal: Journal) -> list[int]:
        counts: list[int] = []
        real = journal.read

        def read(*args: Any, **kwargs: Any) -> ReadResult:
            result = real(*args, **kwargs)
            counts.append(len(result.entries))
            return result

        journal.read = read  # type: ignore[method-assign]
        return counts

    return patch
