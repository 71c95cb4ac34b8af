"""The platform side of the SDK: settings, the HTTP client and error mapping.

Nothing here knows about journals or threads; the shippers drive it.
"""

from .client import PlatformClient, json_body
from .errors import error_from_response, is_ambiguous, never_reached, parse_retry_after
from .settings import MODE_ENV, TRACES_OPT_OUT_ENV, Settings, resolve_settings, split_api_root

__all__ = [
    "MODE_ENV",
    "TRACES_OPT_OUT_ENV",
    "PlatformClient",
    "Settings",
    "error_from_response",
    "is_ambiguous",
    "json_body",
    "never_reached",
    "parse_retry_after",
    "resolve_settings",
    "split_api_root",
]
