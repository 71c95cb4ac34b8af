"""Hostile requests against the local platform, as the security review sent
them: the generators live in ``tools/security/hostile_requests.py``, which
also sends them to a running ``primeruns serve`` by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "security"))

from hostile_requests import (
    cross_site_form_post,
    nested_json,
    nested_trace_line,
    newline_gzip_bomb,
    traces_upload,
)
from parquet_bomb import BOMB_ROWS as PARQUET_BOMB_ROWS
from parquet_bomb import BOMB_VALUE as PARQUET_BOMB_VALUE
from parquet_bomb import bomb as parquet_bomb

__all__ = [
    "PARQUET_BOMB_ROWS",
    "PARQUET_BOMB_VALUE",
    "cross_site_form_post",
    "nested_json",
    "nested_trace_line",
    "newline_gzip_bomb",
    "parquet_bomb",
    "traces_upload",
]
