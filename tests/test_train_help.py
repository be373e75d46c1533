"""``foxhunt-train --help`` is foxhunt's page (conf/hydra/default.yaml, hydra.help): the groups
meant for training with their options as conf/ has them, five examples that compose as written,
and the tab-completion command, which works with this entry point."""

from __future__ import annotations

import itertools
import re
import shlex

import pytest

from configs import CONF_DIR
from foxhunt.config.schema import validate
from train_entry import run_foxhunt_train

NO_DEFAULT = {"preset", "hparams_search", "debug"}  # null in conf/train.yaml's defaults
COMPLETION = 'eval "$(foxhunt-train --shell-completion install=bash)"'


def _run(monkeypatch, tmp_path, capsys, *args: str) -> str:
    assert not run_foxhunt_train(monkeypatch, tmp_path, list(args))  # Hydra ends some flags with exit status 0
    return capsys.readouterr().out


@pytest.fixture
def page(monkeypatch, tmp_path, capsys) -> str:
    return _run(monkeypatch, tmp_path, capsys, "--help")


def _section(page: str, title: str) -> list[str]:
    lines = page.split(f"== {title}")[1].split("\n== ")[0].splitlines()[1:]
    return [line for line in lines if line.strip()]


def test_the_page_is_foxhuntS_not_hydraS(page):
    assert page.startswith("foxhunt-train: train one cell")
    assert "Powered by Hydra" not in page and "== Config ==" not in page  # not the whole config dumped
    groups = {line.split()[0] for line in _section(page, "Config groups")}
    assert groups == {"model", "asset", "data", "precision", "trainer", "budget", "strategy", "preset", "hparams_search",
                      "debug"}  # fmt: skip
    assert not groups & {"bench", "ensemble", "paper", "roll", "paths", "hydra"}  # groups not meant for training


def test_each_groups_options_are_conf_s_and_the_default_first(page, compose_cfg):
    choices = compose_cfg([]).hydra.runtime.choices
    for line in _section(page, "Config groups"):
        group, rest = line.split(maxsplit=1)
        options = [option.strip() for option in re.split(r"\s{2,}\(", rest)[0].split(",")]
        assert sorted(options) == sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml")), group
        if group in NO_DEFAULT:
            assert choices[group] is None
        else:
            assert options[0] == choices[group], group


def _cells(args: list[str]) -> list[list[str]]:
    """A -m line's cells (each comma list swept, as the basic sweeper does); a plain line is one."""
    if "-m" not in args:
        return [args]
    args = [arg for arg in args if arg != "-m"]
    values = [[f"{arg.split('=')[0]}={v}" for v in arg.split("=", 1)[1].split(",")] for arg in args]
    return [list(cell) for cell in itertools.product(*values)]


def test_five_examples_compose_and_validate_as_written(page, compose_cfg):
    examples = [shlex.split(line, comments=True) for line in _section(page, "Examples")]
    assert len(examples) == 5 and all(example[0] == "foxhunt-train" for example in examples)
    for example in examples:
        for cell in _cells(example[1:]):
            cfg = compose_cfg(cell)
            validate(cfg)  # a sweeping preset's own cells: tests/config/test_presets


def test_the_completion_command_is_given_and_completes_with_this_entry_point(page, monkeypatch, tmp_path, capsys):
    assert COMPLETION in page
    monkeypatch.setenv("COMP_LINE", "foxhunt-train preset=")
    assert set(_run(monkeypatch, tmp_path, capsys, "-sc", "query=bash").split()) == {
        f"preset={path.stem}" for path in (CONF_DIR / "preset").glob("*.yaml")
    }
    script = _run(monkeypatch, tmp_path, capsys, "--shell-completion", "install=bash")
    assert script.rstrip().endswith("complete -o nospace -o default -F hydra_bash_completion foxhunt-train")
