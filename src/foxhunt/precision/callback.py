"""Lightning side of a precision policy: one callback that every Trainer of a run carries.

``foxhunt-train`` instantiates the callbacks of ``conf/callbacks/default.yaml``, where
``precision`` is this callback with the run's policy (``${precision}``), so a plain
``foxhunt-train precision=int8`` and any command that builds a Trainer from the same config
convert the model the same way. In ``setup`` (before ``configure_model`` and
``configure_optimizers``, at every stage) it:

- attaches the policy to the module, so the model's ``configure_optimizers`` builds its
  optimizer through :func:`foxhunt.precision.optim.make_optimizer` with 8-bit states;
- under int8 weights, stores the selected weight matrices as int8
  (:func:`foxhunt.precision.quantize.quantize_model`; idempotent, so ``trainer.test`` after
  ``fit`` and a resumed run leave an int8 weight as it is) before Lightning moves the model to
  its device and restores a checkpoint into it.

At the start of fit it writes the per-parameter list ``quantized_layers.txt`` into
``report_dir`` (default: the Trainer's ``default_root_dir``) and, on an ``MLFlowLogger``,
logs it as an artifact with the tags ``precision.int8_tensors`` and
``precision.int8_elements_pct``. The Trainer's own precision plugin (``32-true``,
``bf16-mixed``) comes from ``policy.trainer_precision``, which ``foxhunt-train`` passes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger

from foxhunt.precision.optim import attach_policy
from foxhunt.precision.policy import PrecisionPolicy

log = logging.getLogger(__name__)


class PrecisionCallback(pl.Callback):
    """Apply ``policy`` to the module in ``setup`` and log which layers are int8."""

    def __init__(self, policy: PrecisionPolicy, report_dir: str | Path | None = None) -> None:
        if not isinstance(policy, PrecisionPolicy):
            raise ValueError(f"callbacks.precision.policy: expected a PrecisionPolicy, got {type(policy).__name__}")
        self.policy = policy
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.plan: list = []
        self.report_path: Path | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        attach_policy(pl_module, self.policy)
        if self.policy.quantizes_weights:
            from foxhunt.precision.quantize import quantize_model

            self.plan = quantize_model(pl_module, self.policy)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.policy.quantizes_weights:
            return
        from foxhunt.precision.quantize import QUANTIZED_LAYERS_FILE, int8_share, plan_text

        folder = self.report_dir or Path(trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.report_path = folder / QUANTIZED_LAYERS_FILE
        self.report_path.write_text(plan_text(self.plan, self.policy))
        count, share = int8_share(self.plan)
        log.info("precision %s: %d int8 weight tensors (%.1f%% of parameters), list in %s",
                 self.policy.name, count, share, self.report_path)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id is not None:
                client = logger.experiment
                client.log_artifact(logger.run_id, str(self.report_path))
                client.set_tag(logger.run_id, "precision.int8_tensors", str(count))
                client.set_tag(logger.run_id, "precision.int8_elements_pct", f"{share:.1f}")

