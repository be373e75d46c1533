"""Every tag, param key and MLflow convention foxhunt writes to or reads from the store.

The store's schema is these names. Modules that write or read a tag take its name from here;
a tag that a Lightning callback writes through its own logger and nothing reads back (the
precision callback's ``precision.*`` tags, the memory callback's ``memory_breach``) is named
in that callback.
"""

from __future__ import annotations


class Tag:
    """Run tags, grouped by who writes them."""

    # Every training run (foxhunt.training.cell): which cell it is, and where it came from.
    MODEL = "model"
    ASSET = "asset"
    PRECISION = "precision"
    PRECISION_CHOICE = "precision.choice"  # precision=auto: what it chose on the device and why
    CHECKPOINTING_CHOICE = (
        "activation_checkpointing.choice"  # activation_checkpointing=auto: on or off, and why (foxhunt.training.memory_plan)
    )
    SEED = "seed"
    CONFIG_HASH = "config_hash"  # foxhunt.runs.config_hash: what resume=true looks runs up by
    STRATEGY = "strategy"
    SWEEP_ID = "sweep_id"
    DATA_SOURCE = "data_source"
    OUTPUT_DIR = "output_dir"  # the run's folder, updated on every attempt (checkpoints live there)
    TRIAL = "trial"  # a search sweep's trial (its Hydra job number; foxhunt.sweeps.search)
    CKPT_RUN = "ckpt.run_id"  # ckpt=: the run whose checkpoint this run started from
    CONFIG_DIGEST = "config.sha256"  # SHA-256 of the config.yaml artifact as logged: what reads it back checks it by
    SCORES_DIGEST = "scores.sha256"  # <split>: SHA-256 of its scores/<split>.npz, so a cell reading it back checks it
    # What a reproduction compares (foxhunt.runs.provenance: the files under provenance/).
    DATA_DIGEST = "data.digest"  # SHA-256 of the bars read: each file's bytes and each split's bars (data.json)
    CODE_DIGEST = "code.digest"  # SHA-256 of the files of the foxhunt package the run ran (code.json)
    CODE_DIRTY = "code.dirty"  # true when the package folder differs from its git commit (code.diff), unknown without git
    FOXHUNT_VERSION = "foxhunt.version"  # the installed foxhunt distribution's version
    ENVIRONMENT_DIGEST = "environment.digest"  # SHA-256 of Python's and every installed package's version (environment.json)
    DEVICE_NAME = "device.name"  # <cpu|cuda>: <CPU model or CUDA device name> (device.json)
    # A reproduction's run (foxhunt runs reproduce: foxhunt.runs.reproduce), in REPRODUCTIONS_EXPERIMENT.
    REPRODUCTION_OF = "reproduction_of"  # the run it retrained
    REPRODUCTION_VERDICT = "reproduction.verdict"  # identical, or differs: the first input that differs
    # foxhunt runs prune (foxhunt.runs.prune): when and what of the run's stored artifacts it removed.
    ARTIFACTS_PRUNED = "artifacts.pruned"
    # The process that runs it (TrackedRun, the sweep's parent run, the supervisor).
    JOB_ID = "job_id"
    PID = "pid"
    HOST = "host"
    # How it ended, and how often it was reopened.
    ERROR = "error"
    STOP_REASON = "stop_reason"
    RESUME_COUNT = "resume_count"
    # A sweep's parent run (foxhunt.sweeps.callback).
    RUN_KIND = "foxhunt.run_kind"  # RUN_KIND_SWEEP
    ROLE = "foxhunt.role"  # a cell run made of children: "cell"; each child (fold, seed): "fold"
    FOLD = "fold"  # a walk-forward child's fold index
    PROTOCOL = "protocol"  # a cell run's evaluation protocol, in words
    SWEEP_HASH = "sweep_hash"
    SWEEP_DIR = "sweep_dir"
    OVERRIDES = "overrides"  # the command-line overrides, one string (memory validate: its own)
    PACKING = "packing"
    FAILED_CELLS = "failed_cells"
    # A search sweep's parent run (hparams_search=...: foxhunt.sweeps.search): the study and
    # the best trial by the value foxhunt-train returned (foxhunt.training.cell.OBJECTIVE).
    STUDY = "study"
    BEST_TRIAL = "best_trial"  # the trial's name, <model>-<asset>-<precision>-trial<N>
    BEST_TRIAL_RUN = "best_trial.run_id"
    BEST_VALUE = "best_trial.value"
    BEST_OVERRIDES = "best_trial.overrides"  # the searched keys' values, as Hydra overrides
    # One tag per cell resume=true skipped without a run of its own in the sweep:
    # ``foxhunt.skipped.<model>-<asset>-<precision>-s<seed>`` = JSON of a CellResult.
    SKIPPED_PREFIX = "foxhunt.skipped."
    # A job's parent run, set by its supervisor (foxhunt.jobs.supervisor).
    COMMAND = "command"
    JOB_OVERRIDES = "job.overrides"  # JSON list
    JOB_LOG = "job.log"
    JOB_PLAN = "job.plan"
    JOB_SWEEP_DIR = "job.sweep_dir"
    # The memory commands' runs (foxhunt.commands.memory).
    VERDICT = "verdict"
    DEVICE = "device"
    SUMMARY = "summary"
    BUDGET = "budget"
    MODELS = "models"
    # MLflow's own (mlflow.utils.mlflow_tags): nesting, names, the runs table's Source column.
    PARENT = "mlflow.parentRunId"
    RUN_NAME = "mlflow.runName"
    SOURCE_NAME = "mlflow.source.name"
    SOURCE_TYPE = "mlflow.source.type"
    GIT_COMMIT = "mlflow.source.git.commit"
    USER = "mlflow.user"  # the runs table's User column, and the run's user_id (MLflow's create_run reads this tag)
    DATASET_CONTEXT = "mlflow.data.context"  # on a dataset input: which split


RUN_KIND_SWEEP = "sweep"
ROLE_CELL, ROLE_FOLD = "cell", "fold"  # Tag.ROLE values
SOURCE_TYPE_LOCAL = "LOCAL"
#: The experiment of ``foxhunt runs reproduce``'s runs: apart from the experiments they reproduce,
#: so that leaderboards, selection, deflated Sharpe ratios and ``resume=true`` never count them.
REPRODUCTIONS_EXPERIMENT = "reproductions"
#: The tag of every experiment foxhunt creates: MLflow 3's UI then opens its runs table.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
#: The tags that name a cell of the grid (with CONFIG_HASH, its identity: foxhunt.runs.cell).
CELL_TAGS = (Tag.MODEL, Tag.ASSET, Tag.PRECISION, Tag.SEED)


class Param:
    """Params (the resolved config, flattened) that foxhunt reads back."""

    CHECKPOINT_DIRS = ("callbacks.graceful_stop.dirpath", "callbacks.model_checkpoint.dirpath")
    BUDGET_NAME = "budget.name"
