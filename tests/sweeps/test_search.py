"""Search sweeps without a process: the hparams_search configs, the largest trial the packing
plans from, the fail-fast checks, the best trial, the trials' results and summary."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict, read_write

from foxhunt.errors import ConfigError
from foxhunt.runs.cell import CellKey, CellResult, read_results
from foxhunt.sweeps import search
from foxhunt.sweeps.estimates import CellExceedsBudget, PackingPlan, PeakEstimate, check_fits, plan_packing
from foxhunt.sweeps.summary import format_markdown, format_table, plot_summary

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
SEARCHES = sorted(p.stem for p in (CONF_DIR / "hparams_search").glob("*_optuna.yaml"))


def test_there_is_one_search_per_model():
    assert SEARCHES == ["dqn_optuna", "mamba2_optuna", "ppo_optuna", "tft_optuna"]


@pytest.fixture
def compose_search(tmp_path):
    """``compose_search(overrides)``: the config of ``foxhunt-train -m <overrides>``, Hydra kept
    initialized (the planning composes trials)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):

        def _compose(overrides: list[str]):
            paths = [f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path / 'outputs' / 'run'}"]
            cfg = compose("train", overrides=[*paths, *overrides], return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            return cfg

        yield _compose


def _corner(cfg, pick) -> list[str]:
    """Every searched key at the value ``pick`` chooses among its choices / interval bounds."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Transformer

    parser = OverridesParser.create()
    overrides = []
    for key, text in cfg.hydra.sweeper.params.items():
        override = parser.parse_override(f"{key}={text}")
        if override.is_interval_sweep():
            values = [override.value().start, override.value().end]
        else:
            values = list(override.sweep_iterator(transformer=Transformer.identity))
        overrides.append(f"{key}={Transformer.str(pick(values))}")
    return overrides


@pytest.mark.parametrize("name", SEARCHES)
def test_each_search_composes_and_its_smallest_and_largest_trials_validate(compose_search, name):
    from foxhunt.config.schema import validate

    cfg = compose_search([f"hparams_search={name}"])
    model = name.removesuffix("_optuna")
    sweeper = cfg.hydra.sweeper
    assert cfg.model.name == model and search.is_search(cfg)
    assert sweeper._target_ == "hydra_plugins.foxhunt_optuna_sweeper.sweeper.FoxhuntOptunaSweeper"
    assert sweeper.direction == "maximize" and sweeper.storage is None and sweeper.max_failure_rate == 1.0
    assert list(sweeper.objectives) == ["val/sharpe"] and sweeper.pruner == "none" and sweeper.max_retries == 1
    assert cfg.callbacks.search_report._target_ == "foxhunt.sweeps.pruning.TrialReporter"
    assert cfg.callbacks.search_report.monitor == cfg.model.monitor.metric
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == cfg.seed
    assert sweeper.study_name == f"{model}-es" and sweeper.n_trials >= 10 and sweeper.n_jobs >= 1
    keys = list(sweeper.params)
    assert any(k.endswith(("lr", "learning_rate")) and "log" in sweeper.params[k] for k in keys)  # a log-scale rate
    assert all(k.startswith("model.") and OmegaConf.select(cfg, k, default="missing") != "missing" for k in keys)
    search.check_search_config(cfg)
    validate(cfg)
    header = (CONF_DIR / "hparams_search" / f"{name}.yaml").read_text().splitlines()
    assert header[0] == "# @package _global_" and any(f"foxhunt-train -m hparams_search={name}" in line for line in header)
    # every key at its smallest, then at its largest value: real keys, valid values together
    smallest = _corner(cfg, lambda values: min(values, key=lambda v: sum(v) if isinstance(v, list) else v))
    arguments, planned = search.planning_arguments(cfg)
    assert set(planned) == set(keys)
    for trial in (smallest, [a for a in arguments if not a.startswith("paths.")]):
        validate(compose_search([f"hparams_search={name}", *trial]))


def test_the_largest_trial_takes_each_size_at_its_top_and_plans_unordered_keys_as_a_grid(compose_search):
    from hydra.core.global_hydra import GlobalHydra

    cfg = compose_search(["hparams_search=dqn_optuna", "model.module.lr=3e-4"])
    cfg = _task(cfg, ["hparams_search=dqn_optuna", "model.module.lr=3e-4", "precision=fp32,bf16"])  # as with -m
    arguments, planned = search.planning_arguments(cfg)
    assert "model.module.lr" not in planned and "model.module.lr=3e-4" in arguments  # fixed on the command line
    assert planned["model.module.hidden_sizes"] == "[256,256,256]"  # the largest sum
    assert planned["model.module.batch_size"] == "128" and planned["model.module.replay_capacity"] == "50000"
    assert planned["model.module.gamma"] == "0.999"  # an interval: its upper bound
    assert planned["precision"] == "every value of fp32,bf16"
    cells, _ = search.planning_cells(cfg, GlobalHydra.instance().config_loader())
    assert sorted(next(o for o in c if o.startswith("precision=")) for c in cells) == ["precision=bf16", "precision=fp32"]


def _task(cfg, overrides):
    variant = copy.deepcopy(cfg)
    with read_write(variant.hydra):
        variant.hydra.overrides.task = overrides
    return variant


def test_a_search_plan_packs_copies_of_its_largest_trial(compose_search, tmp_path):
    from foxhunt.sweeps.packing import plan_sweep

    overrides = ["hparams_search=ppo_optuna", "strategy=parallel", "strategy.predict_memory=false", "logger.enabled=false",
                 "hydra.sweeper.n_jobs=4"]  # fmt: skip
    cfg = _task(compose_search(overrides), overrides)
    plan = plan_sweep(cfg)
    assert list(plan.estimates) == ["0"] and plan.estimates["0"].cell == "ppo-es-fp32"
    assert plan.estimates["0"].mb == 200  # the model's target
    assert plan.search["model.module.policy_hidden_sizes"] == "[256,256]"
    assert plan.n_jobs <= 4 and "largest trial of a search" in plan.describe()
    plan.write(tmp_path)
    assert PackingPlan.read(tmp_path) == plan


def test_trials_at_once_are_the_copies_of_the_bound_that_fit_at_most_the_sweepers_batch():
    largest = {"dqn-es-fp32": PeakEstimate("dqn-es-fp32", 400.0, "test")}
    plan = plan_packing(largest, available=1000, budget="b", cores=16, devices=0, requested="auto", trials=4)
    assert (plan.n_jobs, plan.limited_by) == (2, "memory: the 3 largest peaks exceed 1000 MB")
    plan = plan_packing(largest, available=10_000, budget="b", cores=16, devices=0, requested="auto", trials=3)
    assert (plan.n_jobs, plan.limited_by, plan.threads_per_job) == (3, "hydra.sweeper.n_jobs: 3", 5)


def test_a_trial_fits_within_the_bound_else_is_checked_on_its_own_estimate(compose_cfg, tmp_path):
    cfg = compose_cfg(["model=tft", "precision=fp32", "logger.enabled=false", "budget.total_mb=400", "budget.headroom_mb=0"])
    bound = {"tft-es-fp32": PeakEstimate("tft-es-fp32", 300.0, "test")}
    PackingPlan(1, 2, 2, 0, "b", 400, "x", bound, search={"model.module.hidden_size": "256"}).write(tmp_path)
    check_fits(cfg, tmp_path)  # the largest trial fits: so does this one, no estimate made
    bound["tft-es-fp32"] = PeakEstimate("tft-es-fp32", 900.0, "test")
    PackingPlan(1, 2, 2, 0, "b", 400, "x", bound, search={"model.module.hidden_size": "256"}).write(tmp_path)
    with pytest.raises(CellExceedsBudget, match=r"^trial tft-es-fp32 needs 500 MB \(fallback: model.memory_target_mb"):
        check_fits(cfg, tmp_path)  # its own estimate: the TFT's 500 MB target, over 400
    with read_write(cfg):
        cfg.model.memory_target_mb = 350
    check_fits(cfg, tmp_path)


def test_a_search_whose_trials_would_share_a_folder_or_whose_study_is_misconfigured_is_refused(compose_search):
    cfg = compose_search(["hparams_search=dqn_optuna"])
    shared = copy.deepcopy(cfg)
    with read_write(shared.hydra):
        shared.hydra.sweep.subdir = "${model.name}_${asset.key}"
    with pytest.raises(
        search.SearchConfigError, match=r"^hydra.sweep.subdir=\$\{model.name\}_\$\{asset.key\}: .*\$\{hydra.job.num\}"
    ):
        search.check_search_config(shared)
    cases = {
        "storage": ("sqlite:///mlruns/mlflow.db", r"^hydra.sweeper.storage=sqlite:///mlruns/mlflow.db: not MLflow's own database"),
        "pruner": ("mean", r"^hydra.sweeper.pruner=mean: must be one of none, median, hyperband"),
        "objectives": (["test/sharpe"], r"^hydra.sweeper.objectives=\['test/sharpe'\]: test/sharpe: a search optimizes validation metrics"),
        "n_trials": (0, r"^hydra.sweeper.n_trials=0: must be an integer >= 1"),
        "max_failure_rate": (1.5, r"^hydra.sweeper.max_failure_rate=1.5: must be a number in \[0.0, 1.0\]"),
    }  # fmt: skip
    for key, (value, message) in cases.items():
        bad = copy.deepcopy(cfg)
        with read_write(bad.hydra):
            bad.hydra.sweeper[key] = value
        with pytest.raises(ConfigError, match=message):
            search.check_search_config(bad)
    two = copy.deepcopy(cfg)
    with read_write(two.hydra):
        two.hydra.sweeper.objectives = ["val/sharpe", "val/max_drawdown"]
        two.hydra.sweeper.direction = ["maximize", "maximize"]
    with pytest.raises(
        ConfigError, match=r"^hydra.sweeper.direction=\['maximize', 'maximize'\]: val/max_drawdown is better lower: minimize it"
    ):
        search.check_search_config(two)
    with read_write(two.hydra):
        two.hydra.sweeper.direction = ["maximize", "minimize"]
        two.hydra.sweeper.pruner = "median"
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.pruner=median: Optuna prunes single-objective studies only"):
        search.check_search_config(two)
    with read_write(two.hydra):
        two.hydra.sweeper.pruner = "none"
    search.check_search_config(two)  # a Pareto search
    walk = compose_search(["hparams_search=dqn_optuna", "evaluation.protocol=walk_forward"])
    with read_write(walk.hydra):
        walk.hydra.sweeper.objectives, walk.hydra.sweeper.direction = ["val/max_drawdown"], "minimize"
    with pytest.raises(ConfigError, match=r"under evaluation.protocol=walk_forward a search optimizes the mean across folds"):
        search.check_search_config(walk)
    server = compose_search(["hparams_search=dqn_optuna", "logger.tracking_uri=http://127.0.0.1:5000"])
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.storage=null: the MLflow store http://127.0.0.1:5000 is a server"):
        search.check_search_config(server)


@pytest.mark.parametrize(
    ("overrides", "searched", "message"),
    [(["hydra.sweeper.sampler._target_=optuna.samplers.Nope"], None, "hydra.sweeper.sampler: cannot make the sampler (ImportError: "),
     (["+hydra.sweeper.sampler.bogus=1"], None, "hydra.sweeper.sampler: cannot make the sampler (TypeError: "),
     ([], "model.module.nope", "model.module.nope=choice(1,2): model.module.nope is no setting of the config")],
)  # fmt: skip
def test_a_bad_sampler_or_an_unknown_searched_key_is_refused_before_the_study(compose_search, overrides, searched, message):
    """A sampler that cannot be made was a traceback after the parent run was made; an unknown
    searched key was trial 0's failure, counted in n_trials for good (found by a helper)."""
    cfg = compose_search(["hparams_search=dqn_optuna", *overrides])
    if searched is not None:
        with read_write(cfg.hydra), open_dict(cfg.hydra.sweeper.params):
            cfg.hydra.sweeper.params[searched] = "choice(1,2)"
    with pytest.raises(ConfigError) as error:
        search.check_search_config(cfg)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    if searched is not None:
        with read_write(cfg.hydra), open_dict(cfg.hydra.sweeper.params):
            del cfg.hydra.sweeper.params[searched]
            cfg.hydra.sweeper.params["+model.module.extra"] = "choice(1,2)"  # + adds a key: searched
        search.check_search_config(cfg)


def test_the_study_lives_beside_the_mlflow_store_with_this_optuna_and_sqlalchemy(compose_search, tmp_path):
    import optuna
    import sqlalchemy

    from foxhunt.sweeps.study import settings_from

    assert int(optuna.__version__.split(".")[0]) >= 5 and sqlalchemy.__version__ >= "2"
    settings = settings_from(compose_search(["hparams_search=dqn_optuna"]))
    assert settings.storage == f"sqlite:///{(tmp_path / 'mlruns' / 'optuna.db').resolve()}" and settings.name == "dqn-es"
    assert settings.server is None  # a SQLite study's lock is an flock on its host
    named = settings_from(compose_search(["hparams_search=dqn_optuna", "logger.tracking_uri=http://mlflow-host:5000",
                                          "hydra.sweeper.storage=postgresql://u@db-host/optuna"]))  # fmt: skip
    assert named.server == "http://mlflow-host:5000"  # a server study's lock is held on the team's MLflow server


def _trial(number: int, value: float | None, status: str = "FINISHED") -> CellResult:
    return CellResult(CellKey("dqn", "es", "fp32", "42", f"h{number}"), status, f"r{number}", None if status == "FINISHED" else "boom",
                      1.0, None, {"test/sharpe": 0.1}, trial=number,
                      overrides=[f"model.module.lr={number}e-4", "trainer=smoke"], objective=value)  # fmt: skip


def test_the_best_trial_is_optunas_first_best_finite_value():
    results = [
        _trial(0, 1.0),
        _trial(1, float("nan")),
        _trial(2, 3.0),
        _trial(3, None, "FAILED"),
        _trial(4, 3.0),
        _trial(5, -2.0),
    ]
    assert search.best_trial(results, "maximize").trial == 2
    assert search.best_trial(results, "minimize").trial == 5
    assert search.best_trial(results, None) is None  # several objectives
    assert search.best_trial([_trial(0, None, "FAILED")], "maximize") is None
    best = search.best_trial(results, "maximize")
    assert search.searched_overrides(best, ["model.module.lr"]) == ["model.module.lr=2e-4"]
    assert search.describe_best(best, "maximize", ["model.module.lr"], 6) == (
        "best trial: dqn-es-fp32-trial2 (maximize: 3), run r2\n  overrides: model.module.lr=2e-4"
    )


def test_trial_results_round_trip_sort_by_number_and_grid_results_keep_their_shape(tmp_path):
    for number in (10, 2):
        _trial(number, 0.5).write(tmp_path / f"dqn_es_fp32_trial{number}")
    results = read_results(tmp_path)
    assert [r.cell for r in results] == ["dqn-es-fp32-trial2", "dqn-es-fp32-trial10"]
    assert results[0] == _trial(2, 0.5)
    grid = CellResult(CellKey("dqn", "es", "fp32", "42", "h"), "FINISHED")
    assert not {"trial", "objective", "overrides"} & set(grid.to_dict())
    key, value = _trial(3, 0.5).skip_tag()
    assert key == "foxhunt.skipped.dqn-es-fp32-trial3-s42" and json.loads(value)["overrides"] is None


def test_a_search_summary_lists_trials_with_their_value_and_plots_them(tmp_path):
    results = [_trial(0, 1.25), _trial(1, None, "FAILED"), _trial(2, 3.5)]
    lines = format_table(results).splitlines()
    assert lines[0].split()[:3] == ["trial", "status", "objective"]
    assert lines[2].split()[:4] == ["dqn-es-fp32-trial0", "FINISHED", "1.2500", "0.100"]
    assert lines[3].split()[:3] == ["dqn-es-fp32-trial1", "FAILED", "-"]
    text = format_markdown(results, "sweep x", "best trial: dqn-es-fp32-trial2 (maximize: 3.5), run r2")
    assert "best trial: dqn-es-fp32-trial2" in text and "| model |" not in text
    assert text.rstrip().endswith("2 of 3 trials ok; failed: dqn-es-fp32-trial1")
    path = plot_summary(results, tmp_path / "summary.png", "sweep x", "maximize")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finished_trials_whose_folders_are_gone_are_still_finished(compose_search, tmp_path):
    """The summary read each trial's cell.json: with the sweep folder moved away, every finished
    trial was FAILED, the best trial none and the exit status 1, while the study said finished
    (found by a helper). A trial the study holds COMPLETE is finished with the value it was told."""
    import dataclasses
    import shutil

    from test_study import KEY, SPACE, Jobs

    from foxhunt.sweeps.study import open_study, settings_from, study_view
    from foxhunt.sweeps.trials import TrialPool

    cfg = compose_search(["hparams_search=dqn_optuna"])
    settings = settings_from(cfg)
    study, sweep = open_study(settings), tmp_path / "sweep"
    jobs = Jobs(sweep)
    jobs.study = study
    TrialPool(study, dataclasses.replace(settings, n_trials=2), SPACE, ["trainer=smoke"], jobs, 1, True, sweep).run()
    shutil.rmtree(sweep)
    view = study_view(cfg, KEY)
    assert [(r.status, r.objective) for r in view.results] == [("FINISHED", v[0]) for v in view.values.values()]
    assert search.best_trial(view.results, "maximize") is not None


def test_a_study_whose_records_optuna_cannot_read_is_one_line(compose_search, tmp_path):
    """An edited or damaged study database (a distribution that is no JSON, found by a helper with
    others like it) was a JSONDecodeError traceback out of the search."""
    import sqlite3

    from test_study import SPACE

    from foxhunt.sweeps.study import StudyError, open_study, settings_from
    from foxhunt.sweeps.trials import run_search

    cfg = compose_search(["hparams_search=dqn_optuna"])
    settings = settings_from(cfg)
    study = open_study(settings)
    study.tell(study.ask(SPACE), 1.0)
    with sqlite3.connect(settings.storage.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE trial_params SET distribution_json = '{not json'")
    with pytest.raises(StudyError) as error:
        run_search(cfg, None, tmp_path / "sweep")
    assert str(error.value).startswith(f"hydra.sweeper.storage={settings.storage}: study dqn-es has records Optuna cannot read "
                                       "(JSONDecodeError: ")  # fmt: skip
