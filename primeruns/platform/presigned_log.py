"""Keep presigned URLs' signatures out of httpx's request log.

httpx logs every request's URL at INFO on its ``httpx`` logger
(``HTTP Request: PUT https://store/bucket/k.parquet?X-Amz-Signature=...``),
and training scripts often turn INFO on for everything
(``logging.basicConfig(level=logging.INFO)``). A presigned URL's query is a
credential: whoever reads it may write the object until it expires. While
this SDK uploads to one (``uploading_presigned``), the query of the URL in
that line is replaced by ``***`` on the way out; every other request, the
user's own httpx calls among them, is logged as httpx logs it.

httpx writes the line in the thread that sends the request, so a
thread-local mark scopes the filter to our uploads exactly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["uploading_presigned"]

_uploading = threading.local()


class _PresignedQueryHidden(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_uploading, "now", False) and isinstance(record.args, tuple):
            record.args = tuple(_without_query(arg) for arg in record.args)
        return True


def _without_query(arg: Any) -> Any:
    query = getattr(arg, "query", None)  # an httpx.URL: its query as bytes
    if not isinstance(query, bytes) or not query:
        return arg
    return str(arg).partition("?")[0] + "?***"


_FILTER = _PresignedQueryHidden()


@contextlib.contextmanager
def uploading_presigned() -> Iterator[None]:
    """Within: the requests this thread sends are presigned uploads."""
    logging.getLogger("httpx").addFilter(_FILTER)  # once: the same filter is not added twice
    _uploading.now = True
    try:
        yield
    finally:
        _uploading.now = False
