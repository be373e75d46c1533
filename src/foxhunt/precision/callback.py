"""Lightning side of a precision policy that the plugin cannot do: the early int8 conversion and
the reports.

The policy itself lives in the Trainer's precision plugin (:mod:`foxhunt.precision.plugin`),
which converts the module and the optimizers. ``foxhunt-train`` instantiates the callbacks of
``conf/callbacks/default.yaml``, where ``precision`` is this callback; it reads the policy from
``trainer.precision_plugin``. In ``setup`` (before Lightning restores a checkpoint's weights, at
every stage) it stores the selected weight matrices as int8 under int8 weights (the plugin's
:meth:`~foxhunt.precision.plugin.PolicyPrecision.quantize`; idempotent, so ``trainer.test``
after ``fit`` and a resumed run leave an int8 weight as it is), so an int8 checkpoint loads into
int8 weights.

At the start of fit it writes the per-parameter list ``quantized_layers.txt`` into
``report_dir`` (default: the Trainer's ``default_root_dir``) and, on the run's MLflow logger,
logs it as an artifact with the tags ``precision.int8_tensors`` and
``precision.int8_elements_pct``. Under ``bf16-mixed``, during the first training step forward
hooks record the dtype every module computed in; the list goes to ``precision_dtypes.txt``
beside the run (and to MLflow, with the tags ``precision.compute_dtypes`` and
``precision.fp32_islands``), with the plugin's line of what bf16 runs as on this device.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning.pytorch as pl

from foxhunt.precision.bf16 import PRECISION_DTYPES_FILE, DtypeRecorder
from foxhunt.precision.plugin import policy_of, policy_plugin
from foxhunt.runs.tracked_run import trainer_runs

# Lazy imports: (c) foxhunt.precision.quantize (it imports torchao, seconds), in on_fit_start: only an int8 run writes the quantized-layers report

log = logging.getLogger(__name__)


class PrecisionCallback(pl.Callback):
    """Quantize in ``setup`` (before a checkpoint restores into the model) and report."""

    def __init__(self, report_dir: str | Path | None = None) -> None:
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.report_path: Path | None = None
        self.dtypes_path: Path | None = None
        self._recorder: DtypeRecorder | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        policy_plugin(trainer).quantize(pl_module)  # a Trainer without foxhunt's plugin fails here, naming the fix

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        plugin = policy_plugin(trainer)
        if plugin.bf16_line is not None and self.dtypes_path is None and self._recorder is None:
            self._recorder = DtypeRecorder(pl_module).__enter__()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return
        recorder.__exit__(None, None, None)
        plugin = policy_plugin(trainer)
        assert plugin.bf16_line is not None  # the recorder starts only once the line is said
        self.dtypes_path = self._folder(trainer) / PRECISION_DTYPES_FILE
        self.dtypes_path.write_text(recorder.text(plugin.bf16_line, plugin.islands))
        counts = ",".join(f"{dtype}:{n}" for dtype, n in sorted(recorder.counts().items()))
        for store, run_id in trainer_runs(trainer):
            store.log_artifact(run_id, self.dtypes_path)
            store.tag(run_id, {"precision.compute_dtypes": counts, "precision.fp32_islands": ",".join(plugin.islands) or "none"})

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._recorder is not None:  # the fit ended inside its first step
            self._recorder.__exit__(None, None, None)
            self._recorder = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        policy = policy_of(trainer)
        if not policy.quantizes_weights:
            return
        from foxhunt.precision.quantize import QUANTIZED_LAYERS_FILE, int8_share, plan_text

        plan = policy_plugin(trainer).plan
        self.report_path = self._folder(trainer) / QUANTIZED_LAYERS_FILE
        self.report_path.write_text(plan_text(plan, policy))
        count, share = int8_share(plan)
        if count:
            log.info("precision %s: %d int8 weight tensors (%.1f%% of parameters), list in %s", policy.name, count, share,
                     self.report_path)  # fmt: skip
        else:  # a run named int8 that trains in fp32 was said at INFO only (DLinear: found by a helper probing the CLI)
            log.warning("precision %s: no weight tensor qualifies for int8 (each is below its size floor or excluded, list in "
                        "%s): this run trains in fp32 under its int8 name", policy.name, self.report_path)  # fmt: skip
        for store, run_id in trainer_runs(trainer):
            store.log_artifact(run_id, self.report_path)
            store.tag(run_id, {"precision.int8_tensors": count, "precision.int8_elements_pct": f"{share:.1f}"})

    def _folder(self, trainer: pl.Trainer) -> Path:
        folder = self.report_dir or Path(trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
