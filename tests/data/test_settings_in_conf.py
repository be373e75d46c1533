"""Defaults live in conf/ only (issue 39): the synthetic bar source and the forecasters' window
data module take every setting from the config, none has a default of its own in the code
that could drift from conf/data/synthetic.yaml or conf/model/<forecaster>.yaml's model.window."""

from __future__ import annotations

import inspect

import pytest
from omegaconf import OmegaConf

from configs import CONF_DIR, csv_source, synthetic_source
from foxhunt.data.datamodules import ForecastDataModule
from foxhunt.data.sources.csv import CsvBarSource
from foxhunt.data.sources.synthetic import SyntheticBarSource

#: Optional features whose None means "off" (a single regime), absent in configs stored before them.
SYNTHETIC_OPTIONAL = {"change_date", "autocorrelation_after"}
FORECASTERS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml") if "window" in OmegaConf.load(p))


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(cls).parameters.items() if name != "self"}


@pytest.mark.parametrize(("data", "source", "optional"), [("synthetic", SyntheticBarSource, SYNTHETIC_OPTIONAL),
                                                        ("csv", CsvBarSource, set())])  # fmt: skip
def test_a_source_has_no_default_of_its_own(data, source, optional):
    parameters = _parameters(source)
    defaulted = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}
    assert defaulted == dict.fromkeys(optional)  # the synthetic regime change: off (None) unless both are set
    conf_keys = {key for key in OmegaConf.load(CONF_DIR / "data" / f"{data}.yaml").source if key != "_target_"}
    assert conf_keys == set(parameters)  # every setting is in the config, every config key a setting


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
