"""The cells of a sweep as Hydra's basic sweeper expands them: the cartesian product of the
comma lists, the first list varying slowest, plain overrides in every cell."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.sweeps.grid import expand_grid

# never a YAML literal (true, null, nan: Hydra writes those back its own way)
values = st.lists(st.from_regex(r"v[a-z0-9]{0,3}", fullmatch=True), min_size=1, max_size=3, unique=True)


def test_the_grid_is_hydras_cartesian_product():
    assert expand_grid(["model=dqn,tft", "asset=es,nq", "trainer=smoke"]) == [
        ["model=dqn", "asset=es", "trainer=smoke"],
        ["model=dqn", "asset=nq", "trainer=smoke"],
        ["model=tft", "asset=es", "trainer=smoke"],
        ["model=tft", "asset=nq", "trainer=smoke"],
    ]


@settings(max_examples=40, deadline=None)
@given(swept=st.lists(values, min_size=1, max_size=3), fixed=st.lists(values.map(lambda v: v[0]), max_size=2))
def test_every_combination_once_in_the_order_the_sweeper_launches_them(swept, fixed):
    keys = [f"k{i}" for i in range(len(swept))]
    plain = [f"f{i}={v}" for i, v in enumerate(fixed)]
    arguments = [f"{k}={','.join(vs)}" for k, vs in zip(keys, swept)] + plain
    expected = [[f"{k}={v}" for k, v in zip(keys, combo)] + plain for combo in itertools.product(*swept)]
    assert expand_grid(arguments) == expected
