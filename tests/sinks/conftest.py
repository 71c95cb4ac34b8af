"""The sink tests' scripted platform (``tests/scripted_platform.py``), fresh per test."""

from __future__ import annotations

import pytest
from scripted_platform import ScriptedPlatform


@pytest.fixture
def platform() -> ScriptedPlatform:
    return ScriptedPlatform()
