"""The allocator's view of a piece of code: the most its new storages held at once, temporaries
included, views and pre-existing tensors not counted."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.memory.allocations import AllocationPeak

F32 = 4


def test_a_temporary_counts_at_its_peak_even_after_it_is_freed():
    x = torch.ones(1000)  # before the meter: not counted
    with AllocationPeak() as meter:
        temporary = x * 2  # 4,000 bytes
        result = temporary.sum()  # 4 bytes, while the temporary is alive
        del temporary
    assert meter.peak_bytes == 1000 * F32 + F32
    assert meter.live_bytes == F32  # the sum is still held; the temporary was freed
    assert float(result) == 2000.0


def test_views_of_an_input_are_not_allocations():
    x = torch.ones(64, 64)
    with AllocationPeak() as meter:
        rows = x[:32]
        flat = x.view(-1)
        transposed = x.t()
    assert meter.peak_bytes == 0 and rows.numel() + flat.numel() + transposed.numel() > 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 4096), min_size=1, max_size=6))
def test_tensors_held_together_peak_at_their_sum(sizes):
    base = torch.ones(1)
    with AllocationPeak() as meter:
        held = [base.expand(n).clone() for n in sizes]  # each clone one new storage of n floats
    assert meter.peak_bytes == sum(sizes) * F32 == meter.live_bytes
    del held
