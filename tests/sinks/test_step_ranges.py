"""A process's sample id ranges stay in its block, or go far past it."""

from __future__ import annotations

from primeruns.sinks.step_ranges import FAR, WINDOW, Block, StepRanges


def _objects(ranges: StepRanges, step: int, count: int) -> tuple[StepRanges, list[int]]:
    taken = []
    for _ in range(count):
        index = ranges.next_for(step)
        taken.append(index)
        ranges = ranges.used(step, index)
    return ranges, taken


def test_a_rank_past_its_block_goes_on_far_never_into_the_next_ranks() -> None:
    # Rank 1's block is [4, 8), rank 2's [8, 12): rank 1's fifth object of a
    # step took range 8, rank 2's first, and the two shared its sample ids.
    rank1 = StepRanges(Block(4, 8, FAR + 1000))
    rank1, taken = _objects(rank1, 0, 6)
    assert taken == [4, 5, 6, 7, FAR + 1000, FAR + 1001]
    restored = StepRanges.from_carry(rank1.to_carry(), Block(4, 8, FAR + 5000))
    assert _objects(restored, 0, 1)[1] == [FAR + 1002]  # the carried numbering goes on
    assert _objects(restored, 1, 1)[1] == [4]  # another step: its own block


def test_a_folded_step_past_its_block_is_numbered_far_too() -> None:
    ranges = StepRanges(Block(4, 8, FAR + 1000))
    ranges, _ = _objects(ranges, 0, 4)  # the block used up: next is far
    for step in range(1, WINDOW + 2):  # step 0 folded into the bound
        ranges, _ = _objects(ranges, step, 1)
    assert _objects(ranges, 0, 2)[1] == [FAR + 1000, FAR + 1001]


def test_an_unbounded_block_numbers_on() -> None:
    assert _objects(StepRanges(), 0, 3)[1] == [0, 1, 2]
    assert _objects(StepRanges(Block(7)), 0, 3)[1] == [7, 8, 9]


def test_a_carry_of_an_earlier_version_past_the_block_goes_on_far() -> None:
    # An earlier version went on from the end of a rank's block into the
    # next rank's: its carry, restored here, went on there.
    block = Block(4, 8, FAR + 1000)
    restored = StepRanges.from_carry({"ranges": {"0": 9}}, block)
    assert _objects(restored, 0, 2)[1] == [FAR + 1000, FAR + 1001]
    folded = StepRanges.from_carry({"ranges": {}, "ranges_folded": [5, 10]}, block)
    assert _objects(folded, 3, 1)[1] == [FAR + 1000]  # a straggler of a folded step
    far = StepRanges.from_carry({"ranges": {"0": FAR + 5}}, block)
    assert _objects(far, 0, 1)[1] == [FAR + 5]  # far already: goes on there
