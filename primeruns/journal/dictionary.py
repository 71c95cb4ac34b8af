"""Train a zstd dictionary on a run's first records of one kind, if it pays.

A run's records share most of their text (the same prompt template, the same
metric names), but each is compressed alone so any one entry can be read
without its neighbours. A dictionary trained on the first records gives zstd
that shared text: on the gsm8k eval episodes the journal shrinks from 0.38 to
about 0.22 of the raw JSON, and a 300-byte metrics row from 0.75 to about
0.45 (``tools/bench/journal_bench.py``). The dictionary is kept only when it
measurably pays on the very samples it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence

import zstandard

__all__ = ["MAX_SAMPLES", "MAX_TRAINED_DICT_BYTES", "MIN_SAMPLES", "MIN_SAMPLE_BYTES", "train"]

MIN_SAMPLES = 64
MAX_SAMPLES = 256
MIN_SAMPLE_BYTES = 16 << 10
MAX_SAMPLE_BYTES = 4 << 20
# Past MIN_SAMPLES, samples are trained on up to this many bytes: training's
# CPU grows with the bytes it reads (256 gsm8k episodes, 2.4 MB: 68 ms, the
# largest part of the journal's own CPU in a 2,000-episode evaluation; 128
# of them, 1.2 MB: 24 ms) while the dictionary barely improves past ~1 MB
# (0.183 against 0.180 of the raw bytes, the later episodes compressed).
# Small records (metrics rows) still take all MAX_SAMPLES, large ones
# MIN_SAMPLES: none loses its dictionary.
TRAIN_BYTES = 5 << 18
MAX_TRAINED_DICT_BYTES = 112 << 10  # zstd's own guidance: ~100 KB
_PAYS = 0.9  # keep only when it saves at least 10%
# The segment and d-mer sizes of zstd's fast cover trainer, given rather than
# searched for: left to search, training took 0.11-0.15 s of CPU (in the
# uplink, once per kind of a run: a tenth of a millisecond per episode of a
# 1,000-episode evaluation) for dictionaries within 1% of these on gsm8k
# episodes, agentic episodes and metrics rows (measured: 0.025-0.035 s).
_SEGMENT = 1024
_DMER = 8
# The log2 of the trainer's d-mer frequency table (zstd's default: 20, a
# 4 MiB table cleared and walked for every dictionary). 16 trains in about
# two thirds of the time for dictionaries as good (measured on the first
# records the journal trains on, the later ones compressed at level 3:
# gsm8k episodes 34 -> 20 ms, 0.184 -> 0.182 of the raw bytes; agentic
# episodes 140 -> 100 ms, 0.139 both; metrics rows 25 -> 17 ms, 0.353 ->
# 0.348).
_FREQ_LOG = 16


def train(samples: Sequence[bytes]) -> bytes | None:
    """A dictionary for records like ``samples``, or None when it would not pay."""
    samples = _enough(samples)
    total = sum(len(s) for s in samples)
    if len(samples) < MIN_SAMPLES or total < MIN_SAMPLE_BYTES:
        return None
    size = min(MAX_TRAINED_DICT_BYTES, max(4 << 10, total // 8))
    try:
        zdict = zstandard.train_dictionary(size, list(samples), k=_SEGMENT, d=_DMER, f=_FREQ_LOG)
    except zstandard.ZstdError:
        return None  # too few distinct samples: zstd refuses, and plain frames serve
    plain = zstandard.ZstdCompressor(level=1)
    with_dict = zstandard.ZstdCompressor(level=3, dict_data=zdict)
    # Judge on the later half, so the dictionary is not scored on what it memorized alone.
    test = samples[len(samples) // 2 :]
    before = sum(len(plain.compress(s)) for s in test)
    after = sum(len(with_dict.compress(s)) for s in test)
    if after >= before * _PAYS:
        return None
    return bytes(zdict.as_bytes())


def _enough(samples: Sequence[bytes]) -> Sequence[bytes]:
    """The first ``samples``: MIN_SAMPLES of them, and more up to TRAIN_BYTES."""
    total = 0
    for count, sample in enumerate(samples):
        total += len(sample)
        if count >= MIN_SAMPLES and total > TRAIN_BYTES:
            return samples[:count]
    return samples
