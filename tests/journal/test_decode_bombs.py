"""A journal entry made to exhaust memory when decoded is reported as damage,
and decoding it stays small: both decoders (``decoding.decode_entries``, a
forward read's batch decode, and ``layout.decode_entry``, the reference
every other read takes) check the header's length against
``MAX_ENTRY_BYTES`` and zstd's own content size against the header before
anything is allocated (invariants 6 and 8: a journal is untrusted input).

Each check has an entry only it stops: python-zstandard allocates a frame's
claimed content size whole, whatever ``max_output_size`` says, so a frame
claiming 2 GB is a 2 GB allocation once past the checks; and a frame with no
content size fills up to the length it is allowed. Decoding runs in a child
process (a check gone would allocate gigabytes there, not in the test run),
whose peak is measured with ``tracemalloc``: a bytes object's allocation is
traced whether or not its pages are ever touched, where RSS would not show an
untouched one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# What decoding one entry may allocate at its peak: a few copies of the
# frame, never its claimed size.
_SMALL = 16 << 20

_CHILD = textwrap.dedent(
    """
    import json, struct, sys, tracemalloc, zlib
    import zstandard
    from primeruns.journal.decoding import decode_entries
    from primeruns.journal.frames import FLAG_ZSTD, MAX_ENTRY_BYTES, EntryKind
    from primeruns.journal.layout import decode_entry

    SEQ = 7
    MAGIC = struct.pack("<I", 0xFD2FB528)


    def entry(raw_len, body):
        # A version-2 frame of an episode, its checksum right (the seq too).
        head = struct.pack("<BBBBI", 2, int(EntryKind.EPISODE), FLAG_ZSTD, 0, raw_len)
        crc = zlib.crc32(struct.pack(">Q", SEQ), zlib.crc32(body, zlib.crc32(head)))
        return head + struct.pack("<I", crc) + body


    def claims(size):
        # A zstd frame header saying it holds ``size`` bytes (single segment,
        # an 8-byte content size), then a last empty raw block.
        return MAGIC + bytes([0xE0]) + struct.pack("<Q", size) + b"\\x01\\x00\\x00"


    def endless():
        # No content size, and 512 MiB of zeros: far past any length allowed.
        out = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
        chunk = bytes(1 << 20)
        parts = [out.compress(chunk) for _ in range(512)]
        return b"".join(parts) + out.flush()


    bombs = {
        # Header and frame agree on 2 GB: past the length cap.
        "both_claim_2gb": entry(2 << 30, claims(2 << 30)),
        # The header claims 1,000 bytes, the frame 2 GB: the content size check.
        "frame_claims_2gb": entry(1000, claims(2 << 30)),
        # The header claims the most allowed, the frame no size at all.
        "no_content_size": entry(MAX_ENTRY_BYTES, endless()),
    }
    no_dicts = lambda dict_id: None
    found = {}
    tracemalloc.start()
    for name, value in bombs.items():
        for decoder in ("decode_entries", "decode_entry"):
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            if decoder == "decode_entries":
                entries, damaged = [], []
                decode_entries([(SEQ, value)], no_dicts, entries, damaged)
                damage = [d.what for d in damaged]
            else:
                decoded, one = decode_entry(SEQ, value, no_dicts)
                entries, damage = [decoded] if decoded else [], [one.what] if one else []
            peak = tracemalloc.get_traced_memory()[1] - base
            found[f"{name}/{decoder}"] = {"entries": len(entries), "damage": damage, "peak": peak}
    print(json.dumps(found))
    """
)


@pytest.fixture(scope="module")
def decoded() -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, dict[str, object]] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("decoder", ["decode_entries", "decode_entry"])
@pytest.mark.parametrize(
    ("bomb", "said"),
    [
        ("both_claim_2gb", "over the"),
        ("frame_claims_2gb", "zstd frame 2147483648"),
        ("no_content_size", "zstd frame -1"),
    ],
)
def test_an_entry_made_to_exhaust_memory_is_reported_as_damage_and_decoded_small(
    decoded: dict[str, dict[str, object]], bomb: str, said: str, decoder: str
) -> None:
    found = decoded[f"{bomb}/{decoder}"]
    peak = found["peak"]
    assert isinstance(peak, int) and peak < _SMALL, f"{peak / 2**20:.0f} MiB at the peak"
    assert found["entries"] == 0
    [damage] = found["damage"]  # type: ignore[misc]
    assert damage.startswith("entry 7: ") and said in damage, damage  # the check that stops it
