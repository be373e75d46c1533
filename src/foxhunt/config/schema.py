"""Structured schema of the composed training config.

``validate(cfg)`` runs before anything heavy (no data loaded, no model built). A wrong type,
an impossible value or an unknown key raises :class:`ConfigError` whose message is one line
naming the dotted key, the value and what is allowed, e.g.::

    model.window.horizon=60: must be < model.window.seq_len (50)

pydantic does the type and range checks (a well-kept library with precise error locations);
the cross-field rules pydantic cannot express per field are the ``model_validator``s below.
Model hyperparameters are checked twice: against the constructor signature of the class the
config's ``_target_`` names (unknown or missing keys), and against the model's own
hyperparameter schema in :mod:`foxhunt.config.model_schemas` (values).
"""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Annotated, Any, Literal

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from foxhunt.errors import ConfigError
from foxhunt.precision.policy import (
    INFERENCE_CONFIGS,
    LIGHTNING_PRECISIONS,
    OPTIMIZER_STATE_FORMATS,
    QUANTIZABLE_TYPES,
    WEIGHT_FORMATS,
)

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, lt=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, populate_by_name=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Targeted(_Open):
    target: str = Field(alias="_target_", min_length=1)


class Execution(_Strict):
    commission_usd: NonNegativeFloat
    slippage_ticks: NonNegativeFloat


class Bootstrap(_Strict):
    samples: PositiveInt
    block_bars: PositiveInt
    confidence: Fraction
    seed: Annotated[int, Field(ge=0)]


class WalkForward(_Strict):
    folds: PositiveInt
    window: Literal["expanding", "rolling"]
    train: Fraction
    val: Fraction
    test: Fraction
    purge_bars: Annotated[int, Field(ge=0)]

    @model_validator(mode="after")
    def _folds_fit(self) -> "WalkForward":
        total = self.train + self.folds * (self.val + self.test)
        if total > 1:
            raise _KeyedError("folds", self.folds, f"train + folds x (val + test) = {total:g} of the bars: must be <= 1")
        return self


class Interpret(_Strict):
    enabled: bool
    max_windows: PositiveInt | None


class Evaluation(_Strict):
    plot_equity: bool
    max_bars: PositiveInt | None = None
    sessions_per_year: float | Literal["calendar"]
    annualization_span: list[str]
    protocol: Literal["single", "walk_forward"]
    seeds: list[Annotated[int, Field(ge=0, lt=2**32)]] | None
    baselines: list[Literal["flat", "buy_and_hold", "random", "momentum"]]
    bootstrap: Bootstrap
    walk_forward: WalkForward
    fold: Annotated[int, Field(ge=0)] | None
    holdout: Fraction | None = None  # the lockbox: the last fraction of the bars (foxhunt.data.splits)
    interpret: Interpret | None = None  # TFT interpretability (foxhunt.evaluation.interpret); absent in older stored configs

    @field_validator("sessions_per_year", mode="before")
    @classmethod
    def _sessions_per_year(cls, value: Any) -> Any:
        if value == "calendar":
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError("must be 'calendar' (the asset's exchange calendar) or a number of sessions per year > 0")
        return float(value)

    @field_validator("annualization_span", mode="before")
    @classmethod
    def _annualization_span(cls, value: Any) -> Any:
        from datetime import date

        rule = "must be [start, end], trading dates 'YYYY-MM-DD' with start <= end"
        try:
            first, last = (date.fromisoformat(str(d)) for d in value)
        except (TypeError, ValueError):
            raise ValueError(rule) from None
        if last < first:
            raise ValueError(rule)
        return [first.isoformat(), last.isoformat()]

    @model_validator(mode="after")
    def _consistent(self) -> "Evaluation":
        if self.seeds is not None and (not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise _KeyedError("seeds", self.seeds, "must list distinct seeds (or be null)")
        if self.fold is not None and self.fold >= self.walk_forward.folds:
            raise _KeyedError("fold", self.fold, f"must be < walk_forward.folds ({self.walk_forward.folds})")
        return self


class Monitor(_Strict):
    metric: str = Field(min_length=1)
    mode: Literal["min", "max"]


class EnvSettings(_Strict):
    num_envs: PositiveInt
    episode_len: Annotated[int, Field(ge=2)]
    steps_per_epoch: PositiveInt


class WindowSettings(_Strict):
    seq_len: PositiveInt
    horizon: PositiveInt
    batch_size: PositiveInt
    eval_batch_size: PositiveInt

    @model_validator(mode="after")
    def _horizon_shorter_than_sequence(self) -> "WindowSettings":
        if self.horizon >= self.seq_len:
            raise _KeyedError("horizon", self.horizon, f"must be < model.window.seq_len ({self.seq_len})")
        return self


class ModelSection(_Strict):
    name: str = Field(min_length=1)
    kind: Literal["agent", "forecaster"]
    memory_target_mb: PositiveFloat | None
    monitor: Monitor
    module: Targeted
    env: EnvSettings | None = None
    window: WindowSettings | None = None

    @model_validator(mode="after")
    def _kind_has_its_settings(self) -> "ModelSection":
        if self.kind == "agent" and self.env is None:
            raise _KeyedError("env", None, "agents need model.env (num_envs, episode_len, steps_per_epoch)")
        if self.kind == "forecaster" and self.window is None:
            raise _KeyedError("window", None, "forecasters need model.window (seq_len, horizon, batch_size)")
        return self


class AssetSection(Targeted):
    key: str = Field(min_length=1)
    symbol: str = Field(min_length=1)
    tick_size: PositiveFloat
    multiplier: PositiveFloat
    tick_value: PositiveFloat
    price_level: PositiveFloat
    daily_vol: Annotated[float, Field(gt=0, lt=1)]
    session_tz: str
    session_open: str = Field(pattern=r"^\d{2}:\d{2}$")
    session_close: str = Field(pattern=r"^\d{2}:\d{2}$")
    calendar: str = Field(min_length=1)

    @field_validator("calendar")
    @classmethod
    def _known_calendar(cls, value: str) -> str:
        import pandas_market_calendars as mcal

        if value not in mcal.get_calendar_names():
            raise ValueError("unknown exchange calendar (pandas_market_calendars names, e.g. CME_Equity, "
                             "CMEGlobex_FX, CME Globex Fixed Income)")
        return value

    @model_validator(mode="after")
    def _tick_value_consistent(self) -> "AssetSection":
        if not math.isclose(self.tick_value, self.tick_size * self.multiplier, rel_tol=1e-9):
            raise _KeyedError(
                "tick_value", self.tick_value, f"must equal tick_size x multiplier = {self.tick_size * self.multiplier:g}"
            )
        return self


class Features(_Strict):
    momentum_bars: Annotated[int, Field(ge=2)]
    volatility_bars: Annotated[int, Field(ge=2)]
    volume_bars: Annotated[int, Field(ge=2)]
    rth_open: str | None = Field(default=None, pattern=r"^\d{2}:\d{2}$")
    rth_close: str | None = Field(default=None, pattern=r"^\d{2}:\d{2}$")
    rth_tz: str | None = None


class Split(_Strict):
    train: Fraction
    val: Fraction
    test: Fraction
    gap_bars: Annotated[int, Field(ge=0)]

    @model_validator(mode="after")
    def _fractions_sum_to_one(self) -> "Split":
        total = self.train + self.val + self.test
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise _KeyedError("train", self.train, f"train + val + test must sum to 1 (got {total:g})")
        return self


class DataSection(_Strict):
    source: Targeted
    features: Features
    split: Split
    cache_dir: str


class BudgetSection(Targeted):
    name: str = Field(min_length=1)
    kind: Literal["gpu", "cpu"]
    total_mb: PositiveFloat
    headroom_mb: NonNegativeFloat

    @model_validator(mode="after")
    def _headroom_below_total(self) -> "BudgetSection":
        if self.headroom_mb >= self.total_mb:
            raise _KeyedError("headroom_mb", self.headroom_mb, f"must be < budget.total_mb ({self.total_mb:g})")
        return self


class PrecisionSection(Targeted):
    name: str = Field(min_length=1)
    # the allowed values are the policy's own (foxhunt.precision.policy): one list each
    trainer_precision: Literal[LIGHTNING_PRECISIONS]
    weights: Literal[WEIGHT_FORMATS] = "fp32"
    optimizer_states: Literal[OPTIMIZER_STATE_FORMATS] = "32bit"
    optimizer_block_size: PositiveInt | None = None
    compile_optimizer: bool = True
    fuse_fp32_states: bool = False
    quantize_types: list[Literal[QUANTIZABLE_TYPES]] = Field(default_factory=list)
    min_quantized_numel: PositiveInt | None = None
    keep_fp32: list[str] = Field(default_factory=list)
    inference_weights: Literal[INFERENCE_CONFIGS] | None = None
    choice: str | None = None  # precision=auto: what it chose and why (foxhunt.precision.auto)

    @model_validator(mode="after")
    def _policy_rules(self) -> "PrecisionSection":
        """The rules between the fields (int8 weights train under 32-true with 8-bit states, a size
        threshold and layer types; 8-bit states need a block size) have one owner,
        :class:`foxhunt.precision.policy.PrecisionPolicy`: checked here by building it."""
        import dataclasses

        from foxhunt.precision.policy import PrecisionPolicy

        try:
            PrecisionPolicy(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PrecisionPolicy)})
        except ValueError as exc:
            raise _KeyedError.of_line(str(exc).removeprefix("precision.")) from None
        return self


class StrategySection(_Strict):
    """How a sweep's cells run (``conf/strategy``): the launcher, concurrency and threads.

    ``n_jobs`` and ``torch_threads`` take a number or ``auto`` (see ``conf/strategy/*.yaml``);
    the submitit keys size each job of ``slurm`` / ``submitit_local``.
    """

    name: Literal["sequential", "parallel", "submitit_local", "slurm"]
    n_jobs: PositiveInt | Literal["auto"] = 1
    torch_threads: PositiveInt | Literal["auto"] = "auto"
    predict_memory: bool = False
    prediction_cache: str | None = None
    partition: str | None = None
    account: str | None = None
    gpus_per_job: Annotated[int, Field(ge=0)] | None = None
    cpus_per_task: PositiveInt | None = None
    mem_gb: PositiveInt | None = None
    time_min: PositiveInt | None = None
    array_parallelism: PositiveInt | None = None
    setup: list[str] | None = None
    orphan_grace_s: PositiveFloat | None = None

    @field_validator("n_jobs", "torch_threads", mode="before")
    @classmethod
    def _count_or_auto(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError("must be an integer >= 1 or auto")

    @model_validator(mode="after")
    def _cache_for_predictions(self) -> "StrategySection":
        if self.predict_memory and not self.prediction_cache:
            raise _KeyedError("prediction_cache", self.prediction_cache, "required when strategy.predict_memory=true")
        return self


class TrainerSection(Targeted):
    max_epochs: Annotated[int, Field(ge=-1)] | None = None
    max_steps: Annotated[int, Field(ge=-1)] | None = None
    accelerator: str = "auto"

    @field_validator("max_epochs")
    @classmethod
    def _not_zero(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be >= 1, or -1 for no limit")
        return value


class LoggerSection(_Strict):
    enabled: bool
    tracking_uri: str | None
    artifact_location: str | None
    experiment: str = Field(min_length=1)
    log_checkpoints: bool

    @model_validator(mode="after")
    def _uri_when_enabled(self) -> "LoggerSection":
        if self.enabled and not self.tracking_uri:
            raise _KeyedError("tracking_uri", self.tracking_uri, "required when logger.enabled=true")
        return self


class PathsSection(_Open):
    root_dir: str
    mlruns_dir: str
    cache_dir: str
    output_dir: str


class TrainConfig(_Strict):
    task: str = Field(min_length=1)
    seed: Annotated[int, Field(ge=0, lt=2**32)]
    ckpt: str | None
    resume: bool
    execution: Execution
    evaluation: Evaluation
    model: ModelSection
    asset: AssetSection
    data: DataSection
    precision: PrecisionSection
    strategy: StrategySection
    budget: BudgetSection
    trainer: TrainerSection
    callbacks: dict[str, Targeted]
    logger: LoggerSection
    paths: PathsSection

    @model_validator(mode="after")
    def _resume_needs_tracking(self) -> "TrainConfig":
        if self.resume and not self.logger.enabled:
            raise _KeyedError("resume", True, "needs logger.enabled=true (finished and interrupted runs are found in MLflow)")
        return self

    @model_validator(mode="after")
    def _one_key_per_window_setting(self) -> "TrainConfig":
        window, module = self.model.window, self.model.module.model_extra or {}
        for name in ("seq_len", "horizon"):
            if window is not None and name in module and module[name] != getattr(window, name):
                raise _KeyedError(f"model.module.{name}", module[name],
                                  f"the model's {name} is model.window.{name} ({getattr(window, name)}); set that key")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _purge_covers_the_labels(self) -> "TrainConfig":
        reach, why = label_reach(self.model)
        if self.evaluation.protocol == "walk_forward":
            key, gap = "evaluation.walk_forward.purge_bars", self.evaluation.walk_forward.purge_bars
        else:
            key, gap = "data.split.gap_bars", self.data.split.gap_bars
        if gap < reach:
            raise _KeyedError(key, gap, f"must be >= the {self.model.name} labels' reach, {reach} bars ({why})")
        return self


def label_reach(model: ModelSection) -> tuple[int, str]:
    """How many bars ahead a family's labels read (foxhunt.data.splits: the purge must cover
    it): a forecaster its horizon, PPO its rollout (its advantages sum the rollout's rewards),
    any other agent one bar (a one-step target)."""
    if model.window is not None:
        return model.window.horizon, "model.window.horizon"
    rollout = (model.module.model_extra or {}).get("rollout_steps")
    if rollout is not None:
        return int(rollout), "model.module.rollout_steps"
    return 1, "a one-step target"


class EnsembleValidate(_Strict):
    warm_bars: PositiveInt
    probe_calls: PositiveInt
    int8_max_slowdown: PositiveFloat
    int8_min_cut_pct: Annotated[float, Field(ge=0, lt=100)]
    int8_min_agreement: Annotated[float, Field(ge=0, le=1)]
    record_choice: bool


class ServeSection(_Strict):
    max_symbols: PositiveInt
    symbols: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,32}$")]] | None
    idle_evict_s: PositiveFloat | None
    max_bars_per_request: PositiveInt
    max_body_bytes: PositiveInt
    max_batch: PositiveInt
    timeout_s: PositiveFloat
    shutdown_grace_s: NonNegativeFloat


class EnsembleSection(_Strict):
    """``conf/ensemble``: the fleet's members, how they load and how they combine."""

    models: list[Literal["dqn", "ppo", "mamba2", "tft"]] = Field(min_length=1)
    metric: str = Field(min_length=1)
    alias: str = Field(min_length=1)
    gate: Literal["baseline", "interval", "none"]
    versions: dict[str, PositiveInt | None]
    registry_prefix: str = Field(min_length=1)
    rule: Literal["majority", "mean_forecast", "weighted"]
    forecast_threshold: NonNegativeFloat
    weights: Literal["auto", "fp32", "int8"]
    runtime: Literal["auto", "numpy", "numba", "torch"]
    runtime_probe_calls: PositiveInt
    device: str = Field(pattern=r"^(cpu|cuda(:\d+)?)$")
    torch_threads: PositiveInt | None
    split: Literal["train", "val", "test", "all"]
    experiment: str = Field(min_length=1)
    plot_equity: bool
    input_example_decided: PositiveInt
    validate_: EnsembleValidate = Field(alias="validate")
    serve: ServeSection

    @model_validator(mode="after")
    def _consistent(self) -> "EnsembleSection":
        if len(set(self.models)) != len(self.models):
            raise _KeyedError("models", self.models, "a model family is listed twice")
        unknown = sorted(k for k, v in self.versions.items() if v is not None and k not in self.models)
        if unknown:
            raise _KeyedError(f"versions.{unknown[0]}", self.versions[unknown[0]], f"{unknown[0]} is not in ensemble.models {self.models}")
        if self.metric.startswith("test/"):
            raise _KeyedError("metric", self.metric, "a test metric cannot select members (the test split stays unseen); use val/...")
        return self


class PaperRisk(_Strict):
    max_position: Annotated[int, Field(ge=0)]
    max_daily_loss_usd: PositiveFloat | None
    max_drawdown_usd: PositiveFloat | None
    stale_minutes: PositiveInt | None
    on_breach: Literal["stop", "pause"]


class PaperLive(_Strict):
    dataset: str = Field(min_length=1)
    schema_: Literal["ohlcv-1m"] = Field(alias="schema")
    key_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    poll_s: PositiveFloat


class PaperSection(_Strict):
    """``conf/paper``: the paper-trading session (``foxhunt ensemble paper``)."""

    feed: Literal["file", "live"]
    speed: NonNegativeFloat
    split: Literal["train", "val", "test", "all"]
    symbol: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,32}$")] | None
    ledger: str = Field(min_length=1)
    ledger_sync: Literal["normal", "full"]
    capital_usd: PositiveFloat
    fill_price: Literal["next_open", "decision_close"]
    risk: PaperRisk
    live: PaperLive
    view: Literal["auto", "always", "never"]
    view_refresh_hz: PositiveFloat
    experiment: str = Field(min_length=1)
    plot_equity: bool


class FleetConfig(TrainConfig):
    """``conf/fleet.yaml``: the training config plus the ensemble section."""

    ensemble: EnsembleSection
    paper: PaperSection | None = None


class _KeyedError(ValueError):
    """Raised inside validators to point at a sibling field, with the value and the rule."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        super().__init__(f"{field}={value!r}: {rule}" if value is not None else f"{field}: {rule}")
        self.field = field

    @classmethod
    def of_line(cls, line: str) -> "_KeyedError":
        """From a rule's own line, ``<field>[=<value>]: <rule>``."""
        error = cls.__new__(cls)
        ValueError.__init__(error, line)
        error.field = line.split(":", 1)[0].split("=", 1)[0]
        return error


def _format(error: ValidationError) -> str:
    first = error.errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    message = first["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    context = first.get("ctx", {}).get("error")
    if isinstance(context, _KeyedError):
        key = f"{loc}.{context}" if loc else str(context)
        text = key
    elif first["type"] == "missing":
        text = f"{loc}: missing (required)"
    elif first["type"] == "extra_forbidden":
        text = f"{loc}: unknown key"
    else:
        text = f"{loc}={first.get('input')!r}: {message}"
    more = len(error.errors()) - 1
    return text + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")


def check_constructor_args(section: str, node: dict[str, Any]) -> type:
    """Import ``node['_target_']`` and check the keys against its constructor signature."""
    target = node["_target_"]
    module_name, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        raise ConfigError(f"{section}._target_={target!r}: no such class") from None
    parameters = inspect.signature(cls).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    given = {k for k in node if not k.startswith("_")}
    if not accepts_any:
        unknown = sorted(given - set(parameters))
        if unknown:
            allowed = ", ".join(sorted(p for p in parameters if p not in ("self", "args", "kwargs")))
            raise ConfigError(f"{section}.{unknown[0]}: not a parameter of {attr} (allowed: {allowed})")
    required = [
        name
        for name, p in parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    missing = [name for name in required if name not in given]
    if missing:
        raise ConfigError(f"{section}.{missing[0]}: missing (required by {attr})")
    return cls


def validate(cfg: DictConfig) -> TrainConfig:
    """Validate a composed training config (or a fleet config, with its ``ensemble`` section);
    raise :class:`ConfigError` with one line."""
    resolved = resolved_config(cfg)
    schema = FleetConfig if "ensemble" in resolved else TrainConfig
    try:
        parsed = schema.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(_format(exc)) from None

    from foxhunt.config.model_schemas import validate_model_hyperparameters

    module = resolved["model"]["module"]
    cls = check_constructor_args("model.module", module)
    validate_model_hyperparameters(cls, module, resolved["model"])
    source = resolved["data"]["source"]
    check_source_settings(check_constructor_args("data.source", source), source)
    return parsed


class _SweepShared(_Open):
    """The sections every cell of a sweep shares (its launcher and its store)."""

    strategy: StrategySection
    logger: LoggerSection


#: Top-level sections a sweep's cells share: checked once before any cell (:func:`validate_shared`).
SHARED_SECTIONS = ("strategy", "logger")


def validate_shared(cfg: DictConfig) -> None:
    """Validate only what a sweep's cells share (:data:`SHARED_SECTIONS`), before any run or worker;
    every other value may be a swept or searched one and is checked in its own cell."""
    try:
        resolved = {key: OmegaConf.to_container(cfg[key], resolve=True, throw_on_missing=True) for key in SHARED_SECTIONS}
    except Exception as exc:  # omegaconf's own errors carry the full key
        raise ConfigError(_omegaconf_message(exc)) from None
    try:
        _SweepShared.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(_format(exc)) from None


def check_source_settings(cls: type, node: dict[str, Any]) -> None:
    """Construct the bar source: its constructor checks its settings (and reads no file), raising
    ValueError ``"<key>=<value>: <rule>"``, which becomes a ConfigError naming ``data.source.<key>``."""
    try:
        cls(**{key: value for key, value in node.items() if not key.startswith("_")})
    except ValueError as exc:
        raise ConfigError(f"data.source.{' '.join(str(exc).split())}") from None


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain containers, interpolations resolved, without Hydra's own node."""
    try:
        return {
            key: OmegaConf.to_container(cfg[key], resolve=True, throw_on_missing=True)
            if OmegaConf.is_config(cfg[key])
            else cfg[key]
            for key in cfg
            if key != "hydra"
        }
    except Exception as exc:  # omegaconf's own errors carry the full key
        raise ConfigError(_omegaconf_message(exc)) from None


def _omegaconf_message(exc: Exception) -> str:
    key = getattr(exc, "full_key", None)
    text = str(exc).splitlines()[0]
    if "Missing mandatory value" in text and key:
        return f"{key}: missing (required; set it on the command line, e.g. {key}=...)"
    return f"{key}: {text}" if key else text
