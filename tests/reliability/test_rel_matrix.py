"""The configuration matrix (see ``matrix.py``): every record whose call
returned lands exactly once in every sink that applies, the run ends with the
status its ending caused, and the platform holds one run per ``init()``.

CI runs a covering sample (every value of every dimension at least once);
``-m slow`` runs the whole matrix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matrix
import pytest


@pytest.fixture(scope="module")
def platforms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[matrix.Platforms]:
    both = matrix.Platforms(tmp_path_factory.mktemp("matrix"))
    try:
        yield both
    finally:
        both.stop()


SAMPLE = matrix.covering_sample(12, seed=1)
EVERY = [c for c in matrix.all_configs() if c not in SAMPLE]


def _lands_exactly_once(
    config: matrix.Config, platforms: matrix.Platforms, tmp_path: Path, seed: int
) -> None:
    outcome = matrix.run_trial(config, platforms, tmp_path, seed=seed)
    assert outcome.ok, outcome.problems


@pytest.mark.parametrize("config", SAMPLE, ids=[c.label for c in SAMPLE])
def test_configuration_lands_exactly_once(
    config: matrix.Config, platforms: matrix.Platforms, tmp_path: Path
) -> None:
    _lands_exactly_once(config, platforms, tmp_path, SAMPLE.index(config))


@pytest.mark.slow
@pytest.mark.parametrize("config", EVERY, ids=[c.label for c in EVERY])
def test_every_configuration_lands_exactly_once(
    config: matrix.Config, platforms: matrix.Platforms, tmp_path: Path
) -> None:
    _lands_exactly_once(config, platforms, tmp_path, EVERY.index(config))
