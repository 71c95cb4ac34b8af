"""The small value types of the public API: statuses, kinds, environment
references, the training spec and the stored config source.

They are plain dataclasses and enums with validation at construction, so a bad
argument to ``init()`` fails there, with the field named, and never later in a
background thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from .exceptions import ConfigurationError

__all__ = [
    "CONFIG_SOURCE_KEY",
    "CRASH_ERROR",
    "MAX_CONFIG_SOURCE_BYTES",
    "RUN_KIND",
    "ConfigSource",
    "EnvironmentRef",
    "Mode",
    "OnError",
    "RunHandle",
    "RunKind",
    "RunSpec",
    "RunStatus",
    "TrainingSpec",
]

#: The error a run is closed out with when its producer died without finishing it.
CRASH_ERROR = "the producer stopped without finishing the run"

RunKind = Literal["eval", "train"]
#: The kind ``init()`` opens unless told otherwise.
RUN_KIND: RunKind = "eval"
Mode = Literal["online", "offline", "disabled"]
OnError = Literal["warn", "raise"]

#: Key under the run's metadata that holds a config file kept byte for byte.
CONFIG_SOURCE_KEY = "config_source"
#: The platform stores at most this much config text per run.
MAX_CONFIG_SOURCE_BYTES = 256 * 1024

_CONFIG_FORMATS = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


class RunStatus(str, Enum):  # noqa: UP042 (str() is the vendor's "RunStatus.FAILED", not StrEnum's)
    """Where a run stands. ``running`` is the only non-terminal value.

    ``cancelled`` and ``crashed`` reach the platform as failed, with the reason
    in the run's error message. A ``str``: ``RunStatus.FAILED == "failed"``;
    ``str()`` gives ``RunStatus.FAILED`` and ``.value`` gives ``failed``, as
    in the vendor's SDK.
    """

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CRASHED = "crashed"

    def is_terminal(self) -> bool:
        return self is not RunStatus.RUNNING


@dataclass
class EnvironmentRef:
    """An environment the run uses: a hub ``name``, an ``owner/name`` ``slug``,
    or a resolved ``id`` (with an optional ``version_id``)."""

    name: str | None = None
    id: str | None = None
    version_id: str | None = None
    slug: str | None = None

    @classmethod
    def coerce(cls, value: Any) -> EnvironmentRef:
        """Accept a ref, a string (``a/b`` is a slug, else a name) or a mapping."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(slug=value) if "/" in value else cls(name=value)
        if isinstance(value, Mapping):
            return cls(
                name=value.get("name"),
                slug=value.get("slug"),
                id=value.get("id"),
                version_id=value.get("version_id"),
            )
        raise TypeError(
            f"environments: expected a name, an 'owner/name' slug, a mapping or an "
            f"EnvironmentRef, got {type(value).__name__}"
        )

    def __post_init__(self) -> None:
        for field_name in ("name", "id", "version_id", "slug"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(
                    f"environments: {field_name} must be a non-empty string, got {value!r}"
                )
        if not (self.name or self.slug or self.id):
            raise ValueError("environments: each entry needs a name, a slug or an id")
        if self.slug is not None:
            owner, _, env_name = self.slug.partition("/")
            if not owner or not env_name or "/" in env_name:
                raise ValueError(f"environments: slug {self.slug!r} must look like 'owner/name'")

    @property
    def display_name(self) -> str:
        """The environment's name part: the name, the slug's name, or the id."""
        if self.name:
            return self.name
        if self.slug:
            return self.slug.partition("/")[2]
        return str(self.id)


@dataclass
class TrainingSpec:
    """Display fields a training run is registered with. ``max_steps`` is
    required by the platform; ``0`` means unknown."""

    max_steps: int = 0
    batch_size: int | None = None
    rollouts_per_example: int | None = None
    seq_len: int | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_run_name: str | None = None

    def __post_init__(self) -> None:
        for field_name in ("max_steps", "batch_size", "rollouts_per_example", "seq_len"):
            value = getattr(self, field_name)
            if value is None and field_name != "max_steps":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"TrainingSpec.{field_name} must be a non-negative int, got {value!r}"
                )

    def to_body(self) -> dict[str, Any]:
        """The registration fields, None values left out; ``max_steps`` always in."""
        body: dict[str, Any] = {"max_steps": self.max_steps}
        for field_name in (
            "batch_size",
            "rollouts_per_example",
            "seq_len",
            "wandb_project",
            "wandb_entity",
            "wandb_run_name",
        ):
            value = getattr(self, field_name)
            if value is not None:
                body[field_name] = value
        return body


@dataclass
class ConfigSource:
    """The config file a run was started from, kept byte for byte.

    Nothing is redacted: keep credentials in the environment, not in the file.
    """

    text: str
    format: str = "toml"
    filename: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError("ConfigSource.text must be a string")
        size = len(self.text.encode("utf-8", "surrogatepass"))
        if size > MAX_CONFIG_SOURCE_BYTES:
            raise ConfigurationError(
                f"config: {size} bytes is over the {MAX_CONFIG_SOURCE_BYTES}-byte limit "
                "for a stored run config; pass a smaller file or a mapping of the settings "
                "that matter."
            )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": self.format, "text": self.text}
        if self.filename:
            data["filename"] = self.filename
        return data

    @classmethod
    def from_mapping(cls, value: Mapping[str, Any]) -> ConfigSource | None:
        """Rebuild one from its stored form (``to_dict``); None if ``value`` is not one."""
        text = value.get("text")
        if not isinstance(text, str):
            return None
        stored_format, filename = value.get("format"), value.get("filename")
        return cls(
            text=text,
            format=str(stored_format) if stored_format else "toml",
            filename=str(filename) if filename else None,
        )

    @classmethod
    def coerce(cls, value: Any) -> ConfigSource | None:
        """None, a ConfigSource, or a path (a ``str`` is a path, never inline text)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str | os.PathLike):
            return cls.from_file(value)
        raise TypeError(f"a config source is a path or a ConfigSource, not {type(value).__name__}")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ConfigSource:
        """Read a config file as UTF-8 text, its format named by its suffix."""
        resolved = Path(path)
        try:
            raw = resolved.read_bytes()
        except FileNotFoundError as exc:
            raise ConfigurationError(
                f"config={str(path)!r} does not exist. Pass the path of the file the run "
                "was started from, or a mapping of settings."
            ) from exc
        except OSError as exc:
            raise ConfigurationError(
                f"config={str(path)!r} could not be read ({exc.strerror or exc})."
            ) from exc
        if len(raw) > MAX_CONFIG_SOURCE_BYTES:
            raise ConfigurationError(
                f"config={str(path)!r} is {len(raw)} bytes, over the "
                f"{MAX_CONFIG_SOURCE_BYTES}-byte limit for a stored run config; pass a "
                "mapping of the settings that matter instead."
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigurationError(
                f"config={str(path)!r} is not UTF-8 text (byte {exc.start}); save it as "
                "UTF-8 or pass a mapping."
            ) from exc
        return cls(
            text=text,
            format=_CONFIG_FORMATS.get(resolved.suffix.lower(), "text"),
            filename=resolved.name,
        )


@dataclass
class RunSpec:
    """``init()``'s arguments after normalization (the vendor's name for them)."""

    name: str | None = None
    environments: list[EnvironmentRef] = field(default_factory=list)
    model: str | None = None
    framework: str | None = None
    description: str | None = None
    tags: list[str] = field(default_factory=list)
    team_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    kind: RunKind = RUN_KIND
    training: TrainingSpec | None = None


@dataclass
class RunHandle:
    """A registered run as the platform names it."""

    id: str
    name: str | None = None
    url: str | None = None
