"""Composing the training config in tests, as foxhunt-train would (importable by name from any
test folder: ``from configs import compose_train_config``; a ``conftest`` module name is shared
by every folder's conftest and cannot be imported reliably)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"


def compose_train_config(overrides: list[str], root_dir: Path):
    """Compose conf/train.yaml as foxhunt-train would, with every path under ``root_dir``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"paths.root_dir={root_dir}",
                f"paths.output_dir={root_dir / 'outputs' / 'run'}",
                *overrides,
            ],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    return cfg


def _conf_source(data: str, given: dict, settings: dict):
    """The bar source of conf/data/<data>.yaml with its settings (the source's only defaults), the
    ``given`` ones (those the conf leaves to the run: a seed, a path) and ``settings`` replacing some."""
    import importlib

    from omegaconf import OmegaConf

    source = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "data" / f"{data}.yaml").source)  # unresolved: ${seed}, ???
    module, _, name = source.pop("_target_").rpartition(".")
    conf = {key: value for key, value in source.items() if key not in given}
    return getattr(importlib.import_module(module), name)(**given, **{**conf, **settings})


def synthetic_source(seed: int, **settings):
    """A :class:`~foxhunt.data.sources.synthetic.SyntheticBarSource` with conf/data/synthetic.yaml's
    settings, ``settings`` replacing some of them."""
    return _conf_source("synthetic", {"seed": seed}, settings)


def csv_source(path: str, **settings):
    """A :class:`~foxhunt.data.sources.csv.CsvBarSource` of ``path`` with conf/data/csv.yaml's
    settings (the 6E file format), ``settings`` replacing some of them."""
    return _conf_source("csv", {"path": path}, settings)


def lean_source(path: str, **settings):
    """A :class:`~foxhunt.data.sources.lean.LeanMinuteSource` of ``path`` with conf/data/lean.yaml's
    settings (UTC, rolled by volume, not adjusted), ``settings`` replacing some of them."""
    return _conf_source("lean", {"path": path}, settings)


def databento_source(path: str, **settings):
    """A :class:`~foxhunt.data.sources.databento.DatabentoBarSource` of ``path`` with
    conf/data/databento.yaml's settings (GLBX.MDP3, rolled by volume, not adjusted, CSV prices told
    apart), ``settings`` replacing some of them (``roll`` as a whole: both its keys)."""
    return _conf_source("databento", {"path": path}, settings)
