"""Defaults live in conf/ only (issue 39): every bar source of conf/data and the forecasters' window
data module take every setting from the config, none has a default of its own in the code that
could drift from conf/data/<source>.yaml (its roll rule included) or conf/model/<forecaster>.yaml's
model.window."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from configs import CONF_DIR, csv_source, databento_source, lean_source, synthetic_source
from foxhunt.data.datamodules import ForecastDataModule
from foxhunt.data.roll import RollRule
from foxhunt.data.sources.csv import CsvBarSource
from foxhunt.data.sources.synthetic import SyntheticBarSource

#: Optional features whose None means "off" (a single regime), absent in configs stored before them.
OPTIONAL = {"synthetic": {"change_date", "autocorrelation_after"}}
SOURCES = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
FORECASTERS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml") if "window" in OmegaConf.load(p))


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(cls).parameters.items() if name != "self"}


def _defaulted(cls: type) -> dict[str, object]:
    return {name: p.default for name, p in _parameters(cls).items() if p.default is not inspect.Parameter.empty}


def _source_class(target: str) -> type:
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("data", SOURCES)
def test_a_source_has_no_default_of_its_own(compose_cfg, data):
    assert {"synthetic", "csv", "lean", "databento"} <= set(SOURCES), SOURCES
    source = compose_cfg([f"data={data}"]).data.source  # as a run composes it
    cls = _source_class(source._target_)
    optional = OPTIONAL.get(data, set())
    assert _defaulted(cls) == dict.fromkeys(optional)  # the synthetic regime change: off (None) unless both are set
    assert set(source) - {"_target_"} == set(_parameters(cls))  # every setting is in the config, every config key a setting


def test_the_roll_rule_takes_every_setting_from_the_config(compose_cfg):
    fields = {f.name: f.default for f in dataclasses.fields(RollRule)}
    assert all(default is dataclasses.MISSING for default in fields.values()), fields
    for data in ("lean", "databento"):
        source = compose_cfg([f"data={data}"]).data.source
        assert set(source.roll) | {"adjust"} == set(fields), data
    with pytest.raises(ValueError, match=r"^roll\.by: missing \(the mapping needs by, expiry_sessions\)$"):
        RollRule.from_config({"expiry_sessions": 5}, "none")
    with pytest.raises(ValueError, match=r"^roll\.expiry_sessions: missing \(the mapping needs by, expiry_sessions\)$"):
        RollRule.from_config({"by": "volume"}, "none")
    assert RollRule.from_config("open_interest", "ratio").params() == {"by": "open_interest", "expiry_sessions": None,
                                                                       "adjust": "ratio"}  # fmt: skip


def test_the_window_data_module_takes_the_window_from_the_config():
    parameters = _parameters(ForecastDataModule)
    window = {"seq_len", "horizon", "batch_size", "eval_batch_size"}
    assert {name for name in window if parameters[name].default is not inspect.Parameter.empty} == set()
    assert FORECASTERS, "no forecaster config found in conf/model"
    for family in FORECASTERS:
        assert set(OmegaConf.load(CONF_DIR / "model" / f"{family}.yaml").window) == window, family


def test_the_tests_csv_source_is_the_configs():
    source = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "data" / "csv.yaml").source)
    settings = {key: value for key, value in source.items() if key not in ("_target_", "path")}
    assert vars(csv_source("bars.csv", bar_label="start")) == vars(
        CsvBarSource(path="bars.csv", **{**settings, "bar_label": "start"})
    )


@pytest.mark.parametrize("changed", [{}, {"autocorrelation": 0.2, "days": 3}])
def test_the_tests_synthetic_source_is_the_configs(changed):
    source = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "data" / "synthetic.yaml").source)  # seed: ${seed}, unresolved
    settings = {key: value for key, value in source.items() if key not in ("_target_", "seed")}
    assert vars(synthetic_source(seed=5, **changed)) == vars(SyntheticBarSource(seed=5, **{**settings, **changed}))


@pytest.mark.parametrize(("data", "helper"), [("lean", lean_source), ("databento", databento_source)])
def test_the_tests_rolled_sources_are_the_configs(compose_cfg, data, helper):
    source = compose_cfg([f"data={data}", "data.source.path=bars", "data.source.adjust=ratio"]).data.source
    assert vars(helper("bars", adjust="ratio")) == vars(instantiate(source))
