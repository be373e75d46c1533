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

Under ``bf16-mixed`` the callback also fits the policy to the device (:mod:`foxhunt.precision.bf16`):
in ``setup`` it probes which op families have a bf16 kernel there, turns the modules of a
family that has none into fp32 islands (the LSTMs on an AVX2-only CPU), or, where bf16 autocast
cannot run at all, switches the Trainer to ``32-true``; it logs that as one line, once. During
the first training step forward hooks record the dtype every module computed in; the list goes
to ``precision_dtypes.txt`` beside the run (and to MLflow, with the tags
``precision.compute_dtypes`` and ``precision.fp32_islands``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger

from foxhunt.precision.bf16 import PRECISION_DTYPES_FILE, DtypeRecorder, bf16_support, describe, keep_fp32
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
        self.bf16_line: str | None = None  # what bf16 runs as on this device, said once
        self.islands: dict[str, str] = {}
        self.dtypes_path: Path | None = None
        self._recorder: DtypeRecorder | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        attach_policy(pl_module, self.policy)
        if self.policy.quantizes_weights:
            from foxhunt.precision.quantize import quantize_model

            self.plan = quantize_model(pl_module, self.policy)
        if self.policy.trainer_precision == "bf16-mixed" and trainer.precision == "bf16-mixed":
            self._fit_bf16_to_device(trainer, pl_module)

    def _fit_bf16_to_device(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from lightning.pytorch.plugins.precision import Precision

        support = bf16_support(trainer.strategy.root_device)
        if support.usable:
            self.islands = keep_fp32(pl_module, support)
        else:  # before the strategy wraps the model: the whole run is fp32 from here on
            trainer.strategy.precision_plugin = Precision()
        if self.bf16_line is None:
            self.bf16_line = describe(support, self.islands)
            fell_back = self.islands or not support.usable or not support.native
            (log.warning if fell_back else log.info)("%s", self.bf16_line)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if self.bf16_line is not None and self.dtypes_path is None and self._recorder is None:
            self._recorder = DtypeRecorder(pl_module).__enter__()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return
        recorder.__exit__(None, None, None)
        folder = self.report_dir or Path(trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.dtypes_path = folder / PRECISION_DTYPES_FILE
        self.dtypes_path.write_text(recorder.text(self.bf16_line, self.islands))
        counts = ",".join(f"{dtype}:{n}" for dtype, n in sorted(recorder.counts().items()))
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id is not None:
                client = logger.experiment
                client.log_artifact(logger.run_id, str(self.dtypes_path))
                client.set_tag(logger.run_id, "precision.compute_dtypes", counts)
                client.set_tag(logger.run_id, "precision.fp32_islands", ",".join(self.islands) or "none")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._recorder is not None:  # the fit ended inside its first step
            self._recorder.__exit__(None, None, None)
            self._recorder = None

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

