"""The ``preset=`` group (``conf/preset/``): each preset composes, every cell it sweeps passes the
config's validation, and each refuses to run without ``-m`` (it would train one default cell). None
is run here: each is minutes to hours. "experiment" is the MLflow experiment alone (``task``,
``logger.experiment``): no config group bears its name."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from configs import CONF_DIR
from foxhunt.config.schema import validate
from foxhunt.errors import EXIT_USER_ERROR
from train_entry import run_foxhunt_train

PRESETS = sorted(path.stem for path in (CONF_DIR / "preset").glob("*.yaml"))
# What a preset needs from the command line (its data file: es_study reads your own bars).
NEEDS = {"es_study": ["data.source.path=/data/glbx/es-ohlcv-1m.dbn.zst"]}


def _cells(params) -> list[list[str]]:
    """Every cell's overrides of a preset's ``hydra.sweeper.params``, as Hydra's basic sweeper
    expands them (``glob(*)``: every option of the group)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from foxhunt.sweeps.grid import expand_grid

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return expand_grid([f"{key}={params[key]}" for key in params], GlobalHydra.instance().config_loader())


def test_the_presets_are_those_documented():
    assert PRESETS == ["es_study", "grid", "smoke_all", "walk_forward"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_cell_of_a_preset_composes_and_validates(compose_cfg, preset):
    base = [f"preset={preset}", *NEEDS.get(preset, [])]
    cells = _cells(compose_cfg(base).hydra.sweeper.params)
    assert len(cells) > 1  # every preset sweeps: -m is required (next test)
    for cell in cells:
        cfg = compose_cfg([*base, *cell])
        validate(cfg)
        for override in cell:  # the cell is what it says: a group's option, or a number's value
            key, value = override.split("=")
            if "." in key:
                assert float(OmegaConf.select(cfg, key)) == float(value)
            else:
                assert cfg.hydra.runtime.choices[key] == value


def test_what_each_preset_sets(compose_cfg):
    smoke = compose_cfg(["preset=smoke_all"])
    assert smoke.trainer.limit_train_batches == 8 and smoke.evaluation.max_bars == 2000  # trainer=smoke
    assert str(smoke.hydra.sweeper.params.model) == "glob(*)"  # every family of conf/model/: a new one is not left out
    honest = compose_cfg(["preset=walk_forward"])
    assert (honest.evaluation.protocol, honest.resume, honest.data.source.autocorrelation) == ("walk_forward", True, 0.0)
    study = compose_cfg(["preset=es_study", *NEEDS["es_study"]])
    assert study.data.source._target_.endswith("DatabentoBarSource") and study.asset.key == "es"
    assert (study.evaluation.protocol, study.evaluation.holdout, study.resume) == ("walk_forward", 0.1, True)
    lean = compose_cfg(["preset=es_study", "data=lean", "data.source.path=/data/lean/es"])  # the comment's other source
    assert lean.data.source._target_.endswith("LeanMinuteSource")
    narrowed = compose_cfg(["preset=smoke_all", "trainer=default"])  # the command line wins over the preset
    assert narrowed.trainer.limit_train_batches == 500


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_without_multirun_is_one_line(tmp_path, monkeypatch, capsys, preset):
    code = run_foxhunt_train(monkeypatch, tmp_path, [f"preset={preset}", *NEEDS.get(preset, [])])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == EXIT_USER_ERROR and len(err) == 1
    assert err[0].startswith(f"foxhunt-train: config error: preset={preset} sweeps ") and "run it with -m" in err[0]
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("override", ["experiment=grid", "+experiment=grid"])
def test_experiment_is_no_config_group(tmp_path, monkeypatch, capsys, override):
    """The presets' group is ``preset``: ``experiment=grid`` (its name before), or the ``+experiment=grid``
    Hydra's own message advised, is one line that names the group to use, nothing run."""
    assert not (CONF_DIR / "experiment").exists()
    code = run_foxhunt_train(monkeypatch, tmp_path, ["-m", override])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == EXIT_USER_ERROR and len(err) == 1, err
    assert err[0] == (f"foxhunt-train: config error: {override}: the presets are the preset group (preset=grid); "
                      "the MLflow experiment is named by task=<name>")  # fmt: skip
    assert not (tmp_path / "mlruns").exists()
