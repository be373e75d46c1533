"""foxhunt.assets: the four contracts as the exchange publishes them, prices rounded to the
nearest tick, and a contract spec that cannot be right refused in one line naming the key."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from foxhunt.assets import AssetSpec
from foxhunt.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf" / "asset"


def load(key: str) -> AssetSpec:
    raw = OmegaConf.to_container(OmegaConf.load(CONF / f"{key}.yaml"))
    return AssetSpec(**{k: v for k, v in raw.items() if k != "_target_"})


ASSETS = {key: load(key) for key in ("es", "nq", "6e", "zn")}


@pytest.mark.parametrize(
    ("key", "tick_value", "session_minutes", "zone"),
    [("es", 12.5, 23 * 60, "America/New_York"), ("nq", 5.0, 23 * 60, "America/New_York"),
     ("6e", 6.25, 23 * 60, "America/Chicago"), ("zn", 15.625, 23 * 60, "America/Chicago")],
)  # fmt: skip
def test_the_contracts_as_published(key, tick_value, session_minutes, zone):
    spec = ASSETS[key]
    assert spec.key == key and spec.symbol == f"{spec.root}.FUT"
    assert spec.tick_value == tick_value == pytest.approx(spec.tick_size * spec.multiplier)
    assert spec.session_minutes == session_minutes  # Globex: the evening open to the next afternoon's close
    assert str(spec.zone) == zone and spec.close_time.hour - spec.open_time.hour == -1  # a one-hour daily break


@given(key=st.sampled_from(sorted(ASSETS)), ticks=st.integers(-(10**6), 10**6), frac=st.floats(-0.4999, 0.4999))
def test_round_to_tick_goes_to_the_nearest_tick(key, ticks, frac):
    spec = ASSETS[key]
    price = spec.price_level + (ticks + frac) * spec.tick_size
    rounded = float(spec.round_to_tick(price))
    want = spec.price_level + ticks * spec.tick_size
    assert rounded == pytest.approx(want, rel=1e-12, abs=1e-9 * spec.tick_size)
    assert abs(rounded - price) <= spec.tick_size * (0.5 + 1e-6)
    assert float(spec.round_to_tick(rounded)) == pytest.approx(rounded, rel=1e-15)


def test_round_to_tick_works_on_arrays():
    es = ASSETS["es"]
    np.testing.assert_array_equal(es.round_to_tick(np.array([4800.1, 4800.13, 4800.37, -0.2])), [4800.0, 4800.25, 4800.25, -0.25])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tick_value": 12.0}, "asset.tick_value=12.0: must equal tick_size x multiplier = 12.5 for ES.FUT"),
        ({"multiplier": -50.0, "tick_value": -12.5}, "asset.multiplier=-50.0: must be a positive number"),
        ({"tick_size": math.nan}, "asset.tick_size=nan: must be a positive number"),
        ({"daily_vol": 0.0}, "asset.daily_vol=0.0: must be a positive number"),
        ({"price_level": "4800"}, "asset.price_level='4800': must be a positive number"),
        ({"session_open": "25:00"}, "asset.session_open='25:00': must be a local time 'HH:MM'"),
        ({"session_close": "1700"}, "asset.session_close='1700': must be a local time 'HH:MM'"),
        ({"calendar": " "}, "asset.calendar=' ': must name an exchange calendar"),
    ],
)
def test_a_spec_that_cannot_be_right_is_one_line_naming_the_key(change, message):
    with pytest.raises(ValueError) as error:
        dataclasses.replace(ASSETS["es"], **change)
    assert str(error.value).startswith(message)


def test_an_unknown_time_zone_is_refused_and_a_spec_is_frozen():
    with pytest.raises(ConfigError, match=r"^asset\.session_tz='America/Nowhere': not an IANA time zone"):  # one line
        dataclasses.replace(ASSETS["es"], session_tz="America/Nowhere")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ASSETS["es"].tick_size = 0.5
