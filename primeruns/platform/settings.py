"""The platform settings (API key, URLs, team, traces opt-out): they live in
:mod:`primeruns.settings`, the one module that owns every setting and reads
the environment; this module keeps the names its importers use."""

from __future__ import annotations

from ..settings import (
    DEFAULT_BASE_URL,
    DEFAULT_FRONTEND_URL,
    MODE_ENV,
    TRACES_OPT_OUT_ENV,
    Settings,
    config_file_path,
    load_config_file,
    mask_key,
    parse_bool_setting,
    resolve_settings,
    split_api_root,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_FRONTEND_URL",
    "MODE_ENV",
    "TRACES_OPT_OUT_ENV",
    "Settings",
    "config_file_path",
    "load_config_file",
    "mask_key",
    "parse_bool_setting",
    "resolve_settings",
    "split_api_root",
]
