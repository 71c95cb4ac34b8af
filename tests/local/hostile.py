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

__all__ = [
    "cross_site_form_post",
    "nested_json",
    "nested_trace_line",
    "newline_gzip_bomb",
    "traces_upload",
]
