"""What every benchmark section shares: the settings, the folders and the composed runs.

Each section composes ``conf/train.yaml`` exactly as ``foxhunt-train`` would (with the
settings' ``train_overrides``) under the benchmark's work folder, so every side of a comparison
trains on the same cached market dataset and the hyperparameters of ``conf/model/<name>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from foxhunt.config.compose import compose_config
from foxhunt.training.parts import build_dataset


@dataclass
class BenchContext:
    settings: DictConfig
    root: Path  # the folder outputs/ lives in
    log: Any = print  # progress lines (one per measurement)
    _datasets: dict[str, Any] = field(default_factory=dict)

    @property
    def work_dir(self) -> Path:
        path = Path(self.settings.work_dir)
        return path if path.is_absolute() else self.root / path

    @property
    def output_dir(self) -> Path:
        path = Path(self.settings.output_dir)
        return path if path.is_absolute() else self.root / path

    def compose(
        self,
        model: str,
        overrides: list[str] | tuple[str, ...] = (),
        logger: str = "none",
        output_dir: Path | None = None,
    ) -> DictConfig:
        """``conf/train.yaml`` for ``model`` with the settings' overrides, the ``logger`` group
        option and every path under the work folder."""
        return compose_config(
            [f"model={model}", f"logger={logger}", *self.settings.train_overrides, *overrides],
            root_dir=self.work_dir,
            output_dir=str(output_dir or self.work_dir / "outputs" / model),
        )

    def dataset(self, cfg: DictConfig):
        """The cached market dataset of ``cfg`` (loaded once per data config)."""
        key = OmegaConf.to_yaml(cfg.data) + OmegaConf.to_yaml(cfg.asset) + OmegaConf.to_yaml(cfg.evaluation)
        if key not in self._datasets:
            self._datasets[key] = build_dataset(cfg)
        return self._datasets[key]
