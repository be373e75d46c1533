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


def synthetic_source(seed: int, **settings):
    """A :class:`~foxhunt.data.sources.synthetic.SyntheticBarSource` with conf/data/synthetic.yaml's
    settings (the source's only defaults), ``settings`` replacing some of them."""
    from omegaconf import OmegaConf

    from foxhunt.data.sources.synthetic import SyntheticBarSource

    source = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "data" / "synthetic.yaml").source)  # seed: ${seed}, unresolved
    conf = {key: value for key, value in source.items() if key not in ("_target_", "seed")}
    return SyntheticBarSource(seed=seed, **{**conf, **settings})
