"""The config schema's cross-field rules: each bad combination is one line naming the key."""

from __future__ import annotations

import pytest

from foxhunt.config.families import family_names
from foxhunt.config.schema import ConfigError, label_reach, validate


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=tft", "model.module.horizon=500"],
         "model.module.horizon=500: the model's horizon is model.window.horizon (10); set that key"),
        (["model=mamba2", "model.module.seq_len=20"],
         "model.module.seq_len=20: the model's seq_len is model.window.seq_len (50); set that key"),
        (["model=tft", "model.window.horizon=30", "data.split.gap_bars=20"],
         "data.split.gap_bars=20: must be >= the tft labels' reach, 30 bars (model.window.horizon)"),
        (["model=ppo", "evaluation.protocol=walk_forward", "evaluation.walk_forward.purge_bars=4"],
         "evaluation.walk_forward.purge_bars=4: must be >= the ppo labels' reach, 8 bars (model.module.rollout_steps)"),
        (["model=dqn", "data.split.gap_bars=0"], "data.split.gap_bars=0: must be >= the dqn labels' reach, 1 bars (a one-step target)"),
        (["evaluation.holdout=1.2"], "evaluation.holdout=1.2: Input should be less than 1 (allowed: a number in (0, 1))"),
        (["evaluation.walk_forward.folds=5"], "evaluation.walk_forward.folds=5: train + folds x (val + test) = 1.1 of the bars: must be <= 1"),
    ],
)  # fmt: skip
def test_a_bad_combination_is_one_line_naming_the_key(compose_cfg, overrides, message):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(overrides))
    assert str(error.value) == message


def test_the_defaults_purge_every_familys_labels(compose_cfg):
    for model in family_names():
        cfg = compose_cfg([f"model={model}", "evaluation.protocol=walk_forward"])
        reach, _ = label_reach(validate(cfg).model)
        assert cfg.evaluation.walk_forward.purge_bars >= reach and cfg.data.split.gap_bars >= reach


def _group_options() -> dict[str, list[str]]:
    """Every option of every config group of conf/ (conf/bench is not a group of the train config)."""
    from configs import CONF_DIR

    groups = {}
    for folder in sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "bench", "__pycache__")):
        groups[folder.name] = sorted(f.stem for f in folder.glob("*.yaml"))
    return groups


def test_every_option_of_every_group_validates(tmp_path):
    """Each option of each group in at least one composition (the i-th option of every group in
    the i-th), through the ensemble config (the training config plus the ensemble, paper and roll groups)."""
    from foxhunt.training.parts import compose_config

    groups = _group_options()
    # a preset (conf/preset/) sets several groups at once (a sweep, resume=true): each is composed and validated
    # whole, cell by cell, in tests/config/test_presets.py, not mixed with other groups' options here
    del groups["preset"]
    assert {"trainer", "model", "data", "strategy", "precision", "budget", "ensemble", "paper"} <= set(groups)
    for i in range(max(len(options) for options in groups.values())):
        chosen = {group: options[i % len(options)] for group, options in groups.items()}
        search = f"{chosen['model']}_optuna"  # a search sets its own family; a family without one (DLinear) none
        if search in groups["hparams_search"]:
            chosen["hparams_search"] = search
        else:
            del chosen["hparams_search"]
        overrides = [f"{group}={option}" for group, option in chosen.items()]
        if chosen["data"] != "synthetic":
            overrides.append("data.source.path=bars")  # mandatory; the constructors read no file
        validate(compose_config(overrides, root_dir=tmp_path, config_name="ensemble"))


BATCHES = "must be a number of batches, an integer in [0, 1000000000], or a fraction of them, a number in [0.0, 1.0]"


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        ("train", ["trainer.limit_train_batches=-1"], f"trainer.limit_train_batches=-1: {BATCHES}"),
        ("train", ["trainer.limit_val_batches=1.5"], f"trainer.limit_val_batches=1.5: {BATCHES}"),
        ("train", ["+trainer.overfit_batches=nan"], f"trainer.overfit_batches=nan: {BATCHES}"),
        ("train", ["trainer.max_epochs=0"], "trainer.max_epochs=0: must be >= 1, or -1 for no limit"),
        ("train", ["trainer.max_epochs=-2"], "trainer.max_epochs=-2: Input should be greater than or equal to -1 (allowed: an integer in [-1, 1000000])"),
        ("train", ["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps=0: Input should be greater than or equal to 1 (allowed: an integer in [1, 1000000000])"),
        ("train", ["trainer.devices=0"], "trainer.devices=0: must be auto, -1 (every device), a number of devices in [1, 1024], or device indices (a list or '0,1')"),
        ("train", ["+trainer.val_check_interval=0.0"], "trainer.val_check_interval=0.0: must be a number of training batches, an integer in [1, 1000000000], a fraction of the epoch in (0.0, 1.0], or a time 'DD:HH:MM:SS'"),
        ("train", ["trainer.gradient_clip_val=-1.0"], "trainer.gradient_clip_val=-1.0: Input should be greater than or equal to 0 (allowed: a number in [0, 1e6])"),
        ("train", ["+trainer.gradient_clip_vall=1.0"], "trainer.gradient_clip_vall: not a parameter of Trainer"),  # a typo is named as one
        ("train", ["+trainer.profilr=simple"], "trainer.profilr: not a parameter of Trainer"),
        ("train", ["+trainer.max_steps=null"], "trainer.max_steps=None: Input should be a valid integer (allowed: an integer in [-1, 1000000000])"),
        ("train", ["seed=4294967296"], "seed=4294967296: Input should be less than or equal to 4294967295 (allowed: an integer in [0, 4294967295])"),
        ("train", ["evaluation.bootstrap.samples=5.0"], "evaluation.bootstrap.samples=5.0: Input should be a valid integer (allowed: an integer in [1, 100000])"),
        ("train", ["execution.commission_usd=inf"], "execution.commission_usd=inf: Input should be a finite number (allowed: a number in [0, 1000])"),
        ("train", ["execution.slippage_ticks=1e300"], "execution.slippage_ticks=1e+300: Input should be less than or equal to 100 (allowed: a number in [0, 100])"),
        ("train", ["asset.price_level=true"], "asset.price_level=True: Input should be a valid number (allowed: a number in (0, 1e7])"),
        ("train", ["+asset.lot=3"], "asset.lot=3: no range is known for a number under this key"),
        ("train", ["callbacks.progress.every_n_steps=0"], "callbacks.progress.every_n_steps=0: Input should be greater than or equal to 1"),
        ("train", ["callbacks.memory_budget.max_overhead_pct=200"], "callbacks.memory_budget.max_overhead_pct=200: Input should be less than or equal to 100"),
        ("train", ["callbacks.progress=null"], "callbacks.progress=None: Input should be a valid dictionary or instance of ProgressSettings"),
        ("train", ["+callbacks.progress.every_n_epochs=2"], "callbacks.progress.every_n_epochs=2: no range is known for a number under this key"),
        ("train", ["data.source.days=10000000000"], "data.source.days=10000000000: must be a whole number in [1, 7305]"),
        ("train", ["data.source.drift_per_day=nan"], "data.source.drift_per_day=nan: must lie in [-0.01, 0.01]"),
        ("train", ["data.source.start=2262-03-01"], "data.source.days=60: the days from start=2262-03-01 must end by 2262-04-10 (pandas' timestamps)"),
        ("train", ["model.expected_seconds_per_batch=-0.5"], "model.expected_seconds_per_batch=-0.5: Input should be greater than 0 (allowed: a number in (0, 3.1536e7])"),
        ("train", ["model=tft", "model.expected_seconds_per_batch=slow"], "model.expected_seconds_per_batch='slow': Input should be a valid number (allowed: a number in (0, 3.1536e7])"),
        ("train", ["jobs.expected_seconds_per_batch_if_unset=nan"], "jobs.expected_seconds_per_batch_if_unset=nan: Input should be a finite number"),
        ("train", ["jobs.batches_per_epoch_if_unknown=0"], "jobs.batches_per_epoch_if_unknown=0: Input should be greater than or equal to 1 (allowed: an integer in [1, 1000000000])"),
        ("train", ["+jobs.seconds=1"], "jobs.seconds: unknown key"),
        ("train", ["model=ppo", "model.module.rollout_steps=0"], "model.module.rollout_steps=0: must be an integer >= 1 and <= 10000000"),
        # the features' widths (a ValueError traceback from the first forward pass, after the run began)
        ("train", ["model=dlinear", "model.module.input_dim=17"], "model.module.input_dim=17: must be 16: the features per bar are"),
        ("train", ["model=dqn", "model.module.state_dim=15"], "model.module.state_dim=15: must be 16: the features per bar are"),
        ("train", ["model=tft", "model.module.known_dim=7"], "model.module.known_dim=7: must be 8: the features per bar are"),
        ("train", ["strategy=parallel", "strategy.n_jobs=2000"], "strategy.n_jobs=2000: must be an integer in [1, 1024] or auto"),
        ("train", ["evaluation.sessions_per_year=400"], "evaluation.sessions_per_year=400: must be 'calendar' (the asset's exchange calendar) or a number of sessions per year in (0, 366]"),
        ("ensemble", ["paper.capital_usd=1e308"], "paper.capital_usd=1e+308: Input should be less than or equal to 10000000000 (allowed: a number in (0, 1e10])"),
        ("ensemble", ["paper.risk.max_position=1001"], "paper.risk.max_position=1001: Input should be less than or equal to 1000 (allowed: an integer in [0, 1000])"),
        ("ensemble", ["paper.risk.max_drawdown_usd=1e11"], "paper.risk.max_drawdown_usd=100000000000.0: Input should be less than or equal to 10000000000"),
        ("ensemble", ["ensemble.serve.max_body_bytes=-1"], "ensemble.serve.max_body_bytes=-1: Input should be greater than or equal to 1 (allowed: an integer in [1, 1073741824])"),
    ],
)  # fmt: skip
def test_a_value_out_of_its_range_is_one_line_naming_the_key_the_value_and_the_range(tmp_path, config, overrides, message):
    from foxhunt.training.parts import compose_config

    with pytest.raises(ConfigError) as error:
        validate(compose_config(overrides, root_dir=tmp_path, config_name=config))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_ranges_admit_their_ends(tmp_path):
    """The largest value of each money setting, and the documented special values, validate."""
    from foxhunt.training.parts import compose_config

    validate(compose_config(["paper.capital_usd=1e10", "paper.risk.max_daily_loss_usd=1e10", "paper.risk.max_position=1000",
                             "execution.commission_usd=1000", "execution.slippage_ticks=100", "trainer.max_epochs=-1",
                             "trainer.limit_train_batches=0", "trainer.limit_val_batches=1.0", "trainer.devices=[0,1]",
                             "+trainer.max_steps=-1", "trainer.num_sanity_val_steps=-1", "callbacks.model_checkpoint.save_top_k=-1",
                             "data.source.days=7305", "data.source.drift_per_day=-0.01", "seed=4294967295"],
                            root_dir=tmp_path, config_name="ensemble"))  # fmt: skip


def test_a_root_folder_whose_name_holds_an_equals_sign_composes(tmp_path):
    """A folder like date=2024-01 (a partition folder) broke Hydra's override grammar in every
    command and every roll: its path was passed as an override (found by a helper probing the roll).
    The folders are set after composing; a user's own paths override keeps its say."""
    from foxhunt.training.parts import compose_config

    root = tmp_path / "date=2024-01"
    cfg = compose_config(["model=dqn"], root_dir=root, config_name="train")
    assert cfg.paths.root_dir == str(root) and cfg.logger.tracking_uri == f"sqlite:///{root}/mlruns/mlflow.db"
    validate(cfg)
    mine = compose_config(["paths.output_dir=/tmp/mine"], root_dir=root, config_name="train")
    assert mine.paths.output_dir == "/tmp/mine"
