"""Structured schema of the composed training config.

``validate(cfg)`` runs before anything heavy (no data loaded, no model built). A wrong type,
an impossible value or an unknown key raises :class:`ConfigError` whose message is one line
naming the dotted key, the value and what is allowed, e.g.::

    model.window.horizon=60: must be < model.window.seq_len (50)

pydantic does the type and range checks (a well-kept library with precise error locations);
the cross-field rules pydantic cannot express per field are the ``model_validator``s below.
Model hyperparameters are checked twice: against the constructor signature of the class the
config's ``_target_`` names (unknown or missing keys), and against that family's definition of
its hyperparameters, the class's ``hyperparameters`` (values and the rules between them; see
:mod:`foxhunt.config.model_schemas`). The bar source's settings are checked by the source's
constructor (:func:`check_source_settings`).

Every number of the config has a range (:func:`_ints`, :func:`_reals`): a value out of it is
refused here, naming the key, the value and the range, instead of reaching numpy, torch or
Lightning. The upper bounds are generous but finite: past them something overflows, hangs or
exhausts memory. A ``_target_`` section whose class foxhunt configures (the trainer, the
callbacks, the asset, the budget, the precision) declares every numeric setting with its
range, and refuses a number under a key it does not declare (:class:`_Ranged`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any, Literal, TypeVar, get_args

import pandas_market_calendars as mcal
from annotated_types import Ge, GroupedMetadata, Gt, Le, Lt
from omegaconf import DictConfig, OmegaConf
from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema

from foxhunt.config.families import families, family_names
from foxhunt.config.model_schemas import MAX_BATCH, MAX_SEED, HyperparameterError, Hyperparameters, shown_bound
from foxhunt.data.features import FEATURE_GROUPS, FEATURE_NAMES
from foxhunt.errors import ConfigError
from foxhunt.precision.policy import (
    INFERENCE_CONFIGS,
    LIGHTNING_PRECISIONS,
    OPTIMIZER_STATE_FORMATS,
    QUANTIZABLE_TYPES,
    WEIGHT_FORMATS,
    PrecisionPolicy,
)

# ---------------------------------------------------------------------------------- ranges
# MAX_SEED (numpy's and torch's seeds) and MAX_BATCH (samples in one batch): foxhunt.config.model_schemas
MAX_BARS = 10**9  # bar counts (windows, purges, gaps, bars scored): 1,900 years of 1-minute bars
MAX_STEPS = 10**9  # optimizer or agent steps, batches
MAX_EPOCHS = 10**6
MAX_CORES = 1024  # processes, threads, CPUs, devices
MAX_MB = 1e8  # memory sizes in MB (100 TB)
MAX_SECONDS = 365 * 86_400.0  # waits, timeouts, evictions (a year)

# Money. The backtest and the paper account add and subtract USD amounts in float64, which
# holds every cent exactly only while the amounts stay small against 2**53: at 1e10 USD the
# spacing of floats is 1.9e-6 USD, so thousands of roundings stay below half a cent; at 1e12 it
# is 1.2e-4 USD (under a hundred roundings), and an account of 1e308 USD has no cents at all
# (every fill's PnL reads 0.00). A fill's costs and quantity are bounded as well (1,000
# contracts, 1,000 USD commission and 100 ticks of slippage per contract at most), so that no
# fill's amount comes near the account's, and 1e300 ticks of slippage cannot overflow it.
MAX_CAPITAL_USD = 1e10  # the account's starting cash and its loss limits
MAX_COMMISSION_USD = 1e3  # per contract per side (CME retail: a few USD)
MAX_SLIPPAGE_TICKS = 100.0  # per contract per side (a market order in a liquid future: a tick or two)
MAX_POSITION = 1000  # contracts per symbol


@dataclass(frozen=True)
class _Range(GroupedMetadata):
    """The range of an ``int`` or ``float`` field, its metadata in ``Annotated[int, _ints(0, 9)]`` or
    ``Annotated[float, _reals(gt=0, lt=1)]``: pydantic's bounds (both ends, each inclusive or not),
    strict (a bool, a string or, for an integer, a float is refused, since the value reaches the
    code as it is written in the config), finite for a number; a refusal says the range, e.g.
    ``Input should be greater than or equal to 0 (allowed: an integer in [0, 4294967295])``."""

    kind: type[int] | type[float]
    low: float
    low_included: bool
    high: float
    high_included: bool

    @property
    def rule(self) -> str:
        low = f"{'[' if self.low_included else '('}{shown_bound(self.low)}"
        high = f"{shown_bound(self.high)}{']' if self.high_included else ')'}"
        return f"{'an integer' if self.kind is int else 'a number'} in {low}, {high}"

    def __iter__(self) -> Iterator[object]:
        rule = self.rule

        def explained(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
            try:
                return handler(value)
            except ValidationError as exc:
                raise ValueError(f"{exc.errors()[0]['msg']} (allowed: {rule})") from None

        yield Strict()
        yield Ge(self.low) if self.low_included else Gt(self.low)
        yield Le(self.high) if self.high_included else Lt(self.high)
        if self.kind is float:
            yield AllowInfNan(False)
        yield WrapValidator(explained)


def _ints(low: int, high: int) -> _Range:
    """An integer in [low, high]."""
    return _Range(int, low, True, high, True)


def _reals(*, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None) -> _Range:
    """A finite number with a lower bound (``ge`` or ``gt``) and an upper one (``le`` or ``lt``)."""
    low, high = (ge if ge is not None else gt), (le if le is not None else lt)
    if low is None or high is None:
        raise TypeError(f"a number's range needs both ends (got ge={ge}, gt={gt}, le={le}, lt={lt})")
    return _Range(float, low, ge is not None, high, le is not None)


@dataclass(frozen=True)
class _OneOf:
    """A ``str`` field whose values are ``names``, a tuple its owner keeps (the precision policy's
    formats): validated and documented as ``Literal[names]``, in ``Annotated[str, _OneOf(names)]``."""

    names: tuple[str, ...]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return handler.generate_schema(Literal.__getitem__(self.names))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _holds_number(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_number(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_number(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _only(accepts: Callable[[Any], bool], rule: str) -> BeforeValidator:
    """A union field (its JSON schema documents the choices) checked first by ``accepts(value)``,
    with one message for every wrong value (a union's own errors would be one per choice): its
    metadata in ``Annotated[<union>, _only(accepts, rule)]``."""

    def check(value: Any) -> Any:
        if not accepts(value):
            raise ValueError(rule)
        return value

    return BeforeValidator(check)


class _Given:
    """Metadata of an ``X | None`` field whose None stands for an absent key (its default): a value
    given is validated as ``X`` alone, so a null is refused as any other value that is not an X."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        (given,) = [arg for arg in get_args(source) if arg is not type(None)]
        return handler.generate_schema(given)


_T = TypeVar("_T")
#: A section that may be absent (None, its default), never null.
MaybeAbsent = Annotated[_T | None, _Given()]

Fraction = Annotated[float, _reals(gt=0, lt=1)]
Seed = Annotated[int, _ints(0, MAX_SEED)]
Bars = Annotated[int, _ints(0, MAX_BARS)]
MegaBytes = Annotated[float, _reals(gt=0, le=MAX_MB)]
Seconds = Annotated[float, _reals(gt=0, le=MAX_SECONDS)]
Cores = Annotated[int, _ints(1, MAX_CORES)]
#: Lightning's ``limit_*_batches`` and ``overfit_batches``: a number of batches or a fraction of them.
Batches = Annotated[Annotated[int, _ints(0, MAX_STEPS)] | Annotated[float, _reals(ge=0, le=1)],
                    _only(lambda v: (_is_int(v) and 0 <= v <= MAX_STEPS) or (isinstance(v, float) and 0.0 <= v <= 1.0),
                          f"must be a number of batches, an integer in [0, {MAX_STEPS}], or a fraction of them, a number in [0.0, 1.0]")]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, populate_by_name=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Targeted(_Open):
    target: str = Field(alias="_target_", min_length=1)


class _Ranged(Targeted):
    """A ``_target_`` section whose numeric settings are all declared with their range: any other
    setting passes to the class, but a number under a key the section does not declare is
    refused (no range is known for it)."""

    @model_validator(mode="after")
    def _numbers_are_declared(self) -> _Ranged:
        for key, value in (self.model_extra or {}).items():
            if _holds_number(value):
                raise _KeyedError(key, value, "no range is known for a number under this key (foxhunt.config.schema "
                                              "declares every numeric setting of the section with its range)")  # fmt: skip
        return self


class Execution(_Strict):
    commission_usd: Annotated[float, _reals(ge=0, le=MAX_COMMISSION_USD)]  # bounded: see MAX_CAPITAL_USD
    slippage_ticks: Annotated[float, _reals(ge=0, le=MAX_SLIPPAGE_TICKS)]


class Bootstrap(_Strict):
    samples: Annotated[int, _ints(1, 100_000)]  # each replicate reads every bar of the split
    block_bars: Annotated[int, _ints(1, MAX_BARS)]
    confidence: Fraction
    seed: Seed


class WalkForward(_Strict):
    folds: Annotated[int, _ints(1, 1000)]
    window: Literal["expanding", "rolling"]
    train: Fraction
    val: Fraction
    test: Fraction
    purge_bars: Bars

    @model_validator(mode="after")
    def _folds_fit(self) -> WalkForward:
        total = self.train + self.folds * (self.val + self.test)
        if total > 1:
            raise _KeyedError("folds", self.folds, f"train + folds x (val + test) = {total:g} of the bars: must be <= 1")
        return self


class Interpret(_Strict):
    enabled: bool
    max_windows: Annotated[int, _ints(1, MAX_BARS)] | None


class Evaluation(_Strict):
    plot_equity: bool
    max_bars: Annotated[int, _ints(2, MAX_BARS)] | None = None  # a backtest needs two bars (1 crashed after training)
    sessions_per_year: Annotated[float, _reals(gt=0, le=366)] | Literal["calendar"]
    annualization_span: list[str]
    protocol: Literal["single", "walk_forward"]
    seeds: Annotated[list[Seed], Field(max_length=1000)] | None  # one run per seed
    baselines: list[Literal["flat", "buy_and_hold", "random", "momentum"]]
    bootstrap: Bootstrap
    walk_forward: WalkForward
    fold: Annotated[int, _ints(0, 999)] | None
    holdout: Fraction | None = None  # the lockbox: the last fraction of the bars (foxhunt.data.splits)
    interpret: Interpret | None = None  # TFT interpretability (foxhunt.evaluation.interpret); absent in older stored configs

    @field_validator("sessions_per_year", mode="before")
    @classmethod
    def _sessions_per_year(cls, value: Any) -> Any:
        if value == "calendar":
            return value
        if not _is_real(value) or not 0 < value <= 366:
            raise ValueError("must be 'calendar' (the asset's exchange calendar) or a number of sessions per year in (0, 366]")
        return float(value)

    @field_validator("annualization_span", mode="before")
    @classmethod
    def _annualization_span(cls, value: Any) -> Any:
        rule = "must be [start, end], trading dates 'YYYY-MM-DD' with start <= end"
        try:
            first, last = (date.fromisoformat(str(d)) for d in value)
        except (TypeError, ValueError):
            raise ValueError(rule) from None
        if last < first:
            raise ValueError(rule)
        return [first.isoformat(), last.isoformat()]

    @model_validator(mode="after")
    def _consistent(self) -> Evaluation:
        if self.seeds is not None and (not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise _KeyedError("seeds", self.seeds, "must list distinct seeds (or be null)")
        if self.fold is not None and self.fold >= self.walk_forward.folds:
            raise _KeyedError("fold", self.fold, f"must be < walk_forward.folds ({self.walk_forward.folds})")
        return self


class Monitor(_Strict):
    metric: str = Field(min_length=1)
    mode: Literal["min", "max"]


class EnvSettings(_Strict):
    num_envs: Annotated[int, _ints(1, 65_536)]
    episode_len: Annotated[int, _ints(2, MAX_BARS)]
    steps_per_epoch: Annotated[int, _ints(1, MAX_STEPS)]


class WindowSettings(_Strict):
    seq_len: Annotated[int, _ints(1, 100_000)]
    horizon: Annotated[int, _ints(1, 100_000)]
    batch_size: Annotated[int, _ints(1, MAX_BATCH)]
    eval_batch_size: Annotated[int, _ints(1, MAX_BATCH)]

    @model_validator(mode="after")
    def _horizon_shorter_than_sequence(self) -> WindowSettings:
        if self.horizon >= self.seq_len:
            raise _KeyedError("horizon", self.horizon, f"must be < model.window.seq_len ({self.seq_len})")
        return self


class ModelSection(_Strict):
    name: str = Field(min_length=1)
    kind: Literal["agent", "forecaster"]
    memory_target_mb: MegaBytes | None
    expected_seconds_per_batch: Seconds | None = None  # a job plan's weight (foxhunt.jobs.launch); none: jobs' default
    monitor: Monitor
    module: Targeted
    env: EnvSettings | None = None
    window: WindowSettings | None = None

    @model_validator(mode="after")
    def _a_family_as_its_file_declares_it(self) -> ModelSection:
        """``model.name`` is the run's family in every record (its tag, its run and folder names,
        ``runs top``, the registry): ``model.name=foo`` labelled a DQN run "foo", and
        ``../../escape`` put its folder elsewhere (found by a helper probing the CLI)."""
        found = families().get(self.name)
        if found is None:
            raise _KeyedError("name", self.name, f"not a model family (one of {', '.join(families())}; a family is its "
                                                  "file conf/model/<name>.yaml)")  # fmt: skip
        modules = {family.module for family in families().values()}
        if self.module.target in modules and (found.kind, found.module) != (self.kind, self.module.target):  # (another
            # target is the module check's: foxhunt.config.model_schemas)
            raise _KeyedError("name", self.name, f"names the family of kind {found.kind} with module {found.module}, but "
                                                 f"model.kind={self.kind} and model.module._target_={self.module.target}")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _kind_has_its_settings(self) -> ModelSection:
        if self.kind == "agent" and self.env is None:
            raise _KeyedError("env", None, "agents need model.env (num_envs, episode_len, steps_per_epoch)")
        if self.kind == "forecaster" and self.window is None:
            raise _KeyedError("window", None, "forecasters need model.window (seq_len, horizon, batch_size)")
        return self


class JobsSection(_Strict):
    """``jobs`` of conf/train.yaml: how ``foxhunt train start`` weighs a job's cells (foxhunt.jobs.launch)."""

    expected_seconds_per_batch_if_unset: Seconds
    batches_per_epoch_if_unknown: Annotated[int, _ints(1, MAX_STEPS)]


class AssetSection(_Ranged):
    key: str = Field(min_length=1)
    symbol: str = Field(min_length=1)
    tick_size: Annotated[float, _reals(gt=0, le=1e4)]
    multiplier: Annotated[float, _reals(gt=0, le=1e8)]  # USD per point (6J: 12.5 million)
    tick_value: Annotated[float, _reals(gt=0, le=1e5)]
    price_level: Annotated[float, _reals(gt=0, le=1e7)]
    daily_vol: Fraction
    session_tz: str
    session_open: str = Field(pattern=r"^\d{2}:\d{2}$")
    session_close: str = Field(pattern=r"^\d{2}:\d{2}$")
    calendar: str = Field(min_length=1)

    @field_validator("calendar")
    @classmethod
    def _known_calendar(cls, value: str) -> str:
        if value not in mcal.get_calendar_names():
            raise ValueError(
                "unknown exchange calendar (pandas_market_calendars names, e.g. CME_Equity, "
                "CMEGlobex_FX, CME Globex Fixed Income)"
            )
        return value

    @model_validator(mode="after")
    def _tick_value_consistent(self) -> AssetSection:
        if not math.isclose(self.tick_value, self.tick_size * self.multiplier, rel_tol=1e-9):
            raise _KeyedError(
                "tick_value", self.tick_value, f"must equal tick_size x multiplier = {self.tick_size * self.multiplier:g}"
            )
        return self


class Features(_Strict):
    momentum_bars: Annotated[int, _ints(2, 1_000_000)]
    volatility_bars: Annotated[int, _ints(2, 1_000_000)]
    volume_bars: Annotated[int, _ints(2, 1_000_000)]
    rth_open: str | None = Field(default=None, pattern=r"^\d{2}:\d{2}$")
    rth_close: str | None = Field(default=None, pattern=r"^\d{2}:\d{2}$")
    rth_tz: str | None = None


class Split(_Strict):
    train: Fraction
    val: Fraction
    test: Fraction
    gap_bars: Bars

    @model_validator(mode="after")
    def _fractions_sum_to_one(self) -> Split:
        total = self.train + self.val + self.test
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise _KeyedError("train", self.train, f"train + val + test must sum to 1 (got {total:g})")
        return self


class DataSection(_Strict):
    source: Targeted
    features: Features
    split: Split
    cache_dir: str = Field(min_length=1)  # '' wrote the feature cache into the current folder (found by a helper)


class BudgetSection(_Ranged):
    name: str = Field(min_length=1)
    kind: Literal["gpu", "cpu"]
    total_mb: MegaBytes
    headroom_mb: Annotated[float, _reals(ge=0, le=MAX_MB)]

    @model_validator(mode="after")
    def _headroom_below_total(self) -> BudgetSection:
        if self.headroom_mb >= self.total_mb:
            raise _KeyedError("headroom_mb", self.headroom_mb, f"must be < budget.total_mb ({self.total_mb:g})")
        return self


class PrecisionSection(_Ranged):
    name: str = Field(min_length=1)
    # the allowed values are the policy's own (foxhunt.precision.policy): one list each
    trainer_precision: Annotated[str, _OneOf(LIGHTNING_PRECISIONS)]
    weights: Annotated[str, _OneOf(WEIGHT_FORMATS)] = "fp32"
    optimizer_states: Annotated[str, _OneOf(OPTIMIZER_STATE_FORMATS)] = "32bit"
    optimizer_block_size: Annotated[int, _ints(1, MAX_BATCH)] | None = None
    compile_optimizer: bool = True
    fuse_fp32_states: bool = False
    quantize_types: list[Annotated[str, _OneOf(QUANTIZABLE_TYPES)]] = Field(default_factory=list)
    min_quantized_numel: Annotated[int, _ints(1, 2**40)] | None = None
    keep_fp32: list[str] = Field(default_factory=list)
    inference_weights: Annotated[str, _OneOf(INFERENCE_CONFIGS)] | None = None
    choice: str | None = None  # precision=auto: what it chose and why (foxhunt.precision.auto)

    @model_validator(mode="after")
    def _policy_rules(self) -> PrecisionSection:
        """The rules between the fields (int8 weights train under 32-true with 8-bit states, a size
        threshold and layer types; 8-bit states need a block size) have one owner,
        :class:`foxhunt.precision.policy.PrecisionPolicy`: checked here by building it."""
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
    n_jobs: Cores | Literal["auto"] = 1
    torch_threads: Cores | Literal["auto"] = "auto"
    predict_memory: bool = False
    prediction_cache: str | None = None
    partition: str | None = None
    account: str | None = None
    gpus_per_job: Annotated[int, _ints(0, 64)] | None = None
    cpus_per_task: Cores | None = None
    mem_gb: Annotated[int, _ints(1, 100_000)] | None = None
    time_min: Annotated[int, _ints(1, 525_600)] | None = None  # at most a year
    array_parallelism: Annotated[int, _ints(1, 100_000)] | None = None
    setup: list[str] | None = None
    orphan_grace_s: Annotated[float, _reals(gt=0, le=3600)] | None = None

    @field_validator("n_jobs", "torch_threads", mode="before")
    @classmethod
    def _count_or_auto(cls, value: Any) -> Any:
        if value == "auto" or (_is_int(value) and 1 <= value <= MAX_CORES):
            return value
        raise ValueError(f"must be an integer in [1, {MAX_CORES}] or auto")

    @model_validator(mode="after")
    def _cache_for_predictions(self) -> StrategySection:
        if self.predict_memory and not self.prediction_cache:
            raise _KeyedError("prediction_cache", self.prediction_cache, "required when strategy.predict_memory=true")
        return self


def _devices(value: Any) -> bool:
    if value == "auto" or (_is_int(value) and (value == -1 or 1 <= value <= MAX_CORES)):
        return True
    if isinstance(value, str):
        return bool(re.fullmatch(r"\s*\d{1,4}\s*(,\s*\d{1,4}\s*)*,?\s*", value))
    return isinstance(value, list) and 0 < len(value) <= MAX_CORES and all(_is_int(v) and 0 <= v < MAX_CORES for v in value)


def _max_time(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return value is None or bool(re.fullmatch(r"\d{1,5}(:\d{1,2}){3}", value))
    units = ("days", "hours", "minutes", "seconds")
    return isinstance(value, dict) and all(k in units and _is_int(v) and 0 <= v <= 10_000_000 for k, v in value.items())


def _val_check_interval(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return value is None or bool(re.fullmatch(r"\d{1,5}(:\d{1,2}){3}", value))
    return (_is_int(value) and 1 <= value <= MAX_STEPS) or (isinstance(value, float) and 0.0 < value <= 1.0)


class TrainerSection(_Ranged):
    """``conf/trainer``: Lightning Trainer arguments (the precision plugin, logger and callbacks
    come from their own sections). Its numeric arguments are declared here with their range;
    a number under any other key is refused."""

    accelerator: str = "auto"
    devices: Annotated[Cores | Literal["auto", -1] | str | list[Annotated[int, _ints(0, MAX_CORES - 1)]],
                       _only(_devices, f"must be auto, -1 (every device), a number of devices in [1, {MAX_CORES}], "
                                       "or device indices (a list or '0,1')")] = "auto"  # fmt: skip
    num_nodes: Cores = 1
    max_epochs: Annotated[int, _ints(-1, MAX_EPOCHS)] | None = None
    min_epochs: Annotated[int, _ints(0, MAX_EPOCHS)] | None = None
    max_steps: Annotated[int, _ints(-1, MAX_STEPS)] = -1
    min_steps: Annotated[int, _ints(0, MAX_STEPS)] | None = None
    max_time: Annotated[str | dict[Literal["days", "hours", "minutes", "seconds"], Annotated[int, _ints(0, 10_000_000)]] | None,
                        _only(_max_time, "must be a time 'DD:HH:MM:SS' or a mapping of days, hours, minutes, seconds "
                                         "(integers in [0, 10000000])")] = None  # fmt: skip
    limit_train_batches: Batches | None = None
    limit_val_batches: Batches | None = None
    limit_test_batches: Batches | None = None
    limit_predict_batches: Batches | None = None
    overfit_batches: Batches = 0.0
    val_check_interval: Annotated[Annotated[int, _ints(1, MAX_STEPS)] | Annotated[float, _reals(gt=0, le=1)] | str | None,
                                  _only(_val_check_interval, f"must be a number of training batches, an integer in [1, {MAX_STEPS}], "
                                                             "a fraction of the epoch in (0.0, 1.0], or a time 'DD:HH:MM:SS'")] = None  # fmt: skip
    check_val_every_n_epoch: Annotated[int, _ints(1, MAX_EPOCHS)] | None = 1
    num_sanity_val_steps: Annotated[int, _ints(-1, MAX_STEPS)] | None = None
    log_every_n_steps: Annotated[int, _ints(1, MAX_STEPS)] | None = None
    accumulate_grad_batches: Annotated[int, _ints(1, 1_000_000)] = 1
    gradient_clip_val: Annotated[float, _reals(ge=0, le=1e6)] | None = None
    reload_dataloaders_every_n_epochs: Annotated[int, _ints(0, MAX_EPOCHS)] = 0
    deterministic: Annotated[
        bool | Literal["warn"] | None,
        _only(lambda v: v is None or isinstance(v, bool) or v == "warn", "must be true, false or warn"),
    ] = None  # 'maybe' passed
    fast_dev_run: Annotated[bool | Annotated[int, _ints(0, MAX_STEPS)],
                            _only(lambda v: isinstance(v, bool) or (_is_int(v) and 0 <= v <= MAX_STEPS),
                                  f"must be true, false or a number of batches in [0, {MAX_STEPS}]")] = False  # fmt: skip

    @field_validator("max_epochs")
    @classmethod
    def _not_zero(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be >= 1, or -1 for no limit")
        return value

    @model_validator(mode="after")
    def _not_foxhunts_own(self) -> TrainerSection:
        # Trainer arguments foxhunt passes itself: +trainer.precision=bf16-mixed was an 81-line traceback
        # ("Received both precision=... and plugins=...") after the run had begun
        for key in self.model_extra or {}:
            if key in TRAINER_ARGUMENTS_OWNED:
                raise _KeyedError(key, (self.model_extra or {})[key],
                                  f"foxhunt sets this Trainer argument itself: {TRAINER_ARGUMENTS_OWNED[key]}")  # fmt: skip
        return self


#: The Trainer arguments foxhunt passes from its own sections, and where a user sets them instead.
TRAINER_ARGUMENTS_OWNED = {
    "precision": "choose the precision group (precision=fp32, bf16 or int8)",
    "plugins": "the precision group's plugin is the Trainer's (precision=fp32, bf16 or int8)",
    "logger": "choose the logger group (logger=mlflow or none)",
    "callbacks": "add or set callbacks under callbacks.<name> (conf/callbacks)",
    "default_root_dir": "set paths.output_dir",
}


class CheckpointSettings(_Ranged):
    """``callbacks.model_checkpoint``: Lightning's ModelCheckpoint."""

    save_top_k: Annotated[int, _ints(-1, 1_000_000)] = 1  # -1: every checkpoint
    every_n_train_steps: Annotated[int, _ints(0, MAX_STEPS)] | None = None
    every_n_epochs: Annotated[int, _ints(0, MAX_EPOCHS)] | None = None


class MemoryBudgetSettings(_Ranged):
    """``callbacks.memory_budget``: foxhunt.memory.callback.MemoryBudgetCallback."""

    budget: BudgetSection
    target_mb: MegaBytes | None
    on_breach: Literal["warn", "stop", "fail"] = "warn"  # checked in the callback only: a bad one failed after the run began
    sample_every_n_steps: Annotated[int, _ints(1, MAX_STEPS)]
    max_overhead_pct: Annotated[float, _reals(gt=0, le=100)]


class ResumePointSettings(_Ranged):
    """``callbacks.resume_point``: foxhunt.training.resume_point.ResumePoint."""

    every_n_train_steps: Annotated[int, _ints(1, MAX_STEPS)]


class WarmStartSettings(_Ranged):
    """``callbacks.warm_start``: foxhunt.training.warm_start.WarmStart."""

    path: str | None = None


class ProgressSettings(_Ranged):
    """``callbacks.progress``: foxhunt.training.progress.ProgressReporter."""

    every_n_steps: Annotated[int, _ints(1, MAX_STEPS)]


class ProgressBarSettings(_Ranged):
    """``callbacks.progress_bar``: Lightning's TQDMProgressBar."""

    refresh_rate: Annotated[int, _ints(0, 1_000_000)]  # 0: no bar
    process_position: Annotated[int, _ints(0, MAX_CORES)] = 0


class CallbacksSection(_Open):
    """``conf/callbacks``: each entry is instantiated and handed to the Trainer. foxhunt's own
    entries are checked with their range (absent: dropped with ``~callbacks.<name>``; never
    null); an entry added on the command line is checked for its ``_target_`` only."""

    precision: MaybeAbsent[_Ranged] = None
    model_checkpoint: MaybeAbsent[CheckpointSettings] = None
    graceful_stop: MaybeAbsent[_Ranged] = None
    resume_point: MaybeAbsent[ResumePointSettings] = None
    warm_start: MaybeAbsent[WarmStartSettings] = None
    memory_budget: MaybeAbsent[MemoryBudgetSettings] = None
    progress: MaybeAbsent[ProgressSettings] = None
    progress_bar: MaybeAbsent[ProgressBarSettings] = None
    checkpoint_stamp: MaybeAbsent[_Ranged] = None
    __pydantic_extra__: dict[str, Targeted]


class LoggerSection(_Strict):
    enabled: bool
    tracking_uri: str | None
    artifact_location: str | None
    experiment: str = Field(min_length=1)
    log_checkpoints: Literal["best", "all", "none"] | bool  # bool: configs stored before the setting (all / none)
    # seconds between MLflow's samples of the machine (system/*); null or absent (a config stored before it): none
    system_metrics_s: Seconds | None = None

    @model_validator(mode="after")
    def _uri_when_enabled(self) -> LoggerSection:
        if self.enabled and not self.tracking_uri:
            raise _KeyedError("tracking_uri", self.tracking_uri, "required when logger.enabled=true")
        return self


class PathsSection(_Open):
    root_dir: str
    mlruns_dir: str
    cache_dir: str
    output_dir: str
    prediction_cache: str | None = None  # absent from configs stored before it (foxhunt.training.memory_plan)


class TrainConfig(_Strict):
    task: str = Field(min_length=1)
    seed: Seed
    ckpt: (
        Annotated[str, Field(min_length=1)] | None
    )  # '' passed the checkpoint check as "none" and Lightning refused it after the fit
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
    callbacks: CallbacksSection
    logger: LoggerSection
    paths: PathsSection
    jobs: JobsSection | None = None  # absent in configs stored before it

    @model_validator(mode="after")
    def _resume_needs_tracking(self) -> TrainConfig:
        if self.resume and not self.logger.enabled:
            raise _KeyedError("resume", True, "needs logger.enabled=true (finished and interrupted runs are found in MLflow)")
        return self

    @model_validator(mode="after")
    def _one_key_per_window_setting(self) -> TrainConfig:
        window, module = self.model.window, self.model.module.model_extra or {}
        for name in ("seq_len", "horizon"):
            if window is not None and name in module and module[name] != getattr(window, name):
                raise _KeyedError(f"model.module.{name}", module[name],
                                  f"the model's {name} is model.window.{name} ({getattr(window, name)}); set that key")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _widths_are_the_features(self) -> TrainConfig:
        # the features per bar are foxhunt.data.features' (fixed): a width that differs was a ValueError traceback
        # from the first forward pass, after the run began (found by a helper adding a family)
        module = self.model.module.model_extra or {}
        widths = {"input_dim": len(FEATURE_NAMES), "state_dim": len(FEATURE_NAMES),
                  **{f"{group}_dim": len(names) for group, names in FEATURE_GROUPS.items()}}  # fmt: skip
        for key, width in widths.items():
            if key in module and module[key] != width:
                raise _KeyedError(f"model.module.{key}", module[key],
                                  f"must be {width}: the features per bar are foxhunt.data.features' "
                                  f"({', '.join(f'{g} {len(n)}' for g, n in FEATURE_GROUPS.items())})")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _log_cadence_fits_the_calls(self) -> TrainConfig:
        # An agent that runs steps_per_call agent steps per training_step (DQN) logs on the
        # agent-step axis (foxhunt.runs.steps.log_on_step) at the end of a call: every
        # log_every_n_steps agent steps where the calls end there, every call where a call is longer.
        per_call = (self.model.module.model_extra or {}).get("steps_per_call")
        every = self.trainer.log_every_n_steps
        if isinstance(per_call, int) and per_call > 1 and every is not None and every > per_call and every % per_call:
            raise _KeyedError("trainer.log_every_n_steps", every,
                              f"must be a multiple of model.module.steps_per_call ({per_call}) or at most it: train metrics "
                              f"are written at the end of a training_step of {per_call} agent steps")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _purge_covers_the_labels(self) -> TrainConfig:
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

    module = model.module.model_extra or {}
    rollout = module.get("rollout_steps")
    if rollout is not None:  # refused by its family's definition: no reach (refused, naming it, after the schema)
        definition = _definition(model.module.target)
        refused = definition is None or "rollout_steps" in definition.refused_keys(module)
        return (0 if refused else rollout), "model.module.rollout_steps"
    return 1, "a one-step target"


class FootprintSection(_Strict):
    warm_bars: Annotated[int, _ints(1, 10_000_000)]
    probe_calls: Annotated[int, _ints(1, 1_000_000)]
    int8_max_slowdown: Annotated[float, _reals(gt=0, le=1000)]
    int8_min_cut_pct: Annotated[float, _reals(ge=0, lt=100)]
    int8_min_agreement: Annotated[float, _reals(ge=0, le=1)]
    record_choice: bool


class ServeSection(_Strict):
    max_symbols: Annotated[int, _ints(1, 1_000_000)]
    symbols: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,32}$")]] | None
    idle_evict_s: Seconds | None
    max_bars_per_request: Annotated[int, _ints(1, 1_000_000)]
    max_body_bytes: Annotated[int, _ints(1, 2**30)]  # a request body is read into memory whole
    max_batch: Annotated[int, _ints(1, 65_536)]
    timeout_s: Annotated[float, _reals(gt=0, le=86_400)]
    read_timeout_s: Annotated[float, _reals(gt=0, le=86_400)]
    max_connections: Annotated[
        int, _ints(1, 1_000_000)
    ]  # files: checked against the process's open-file limit at start (serve.reserve_descriptors)
    health_reserve: Annotated[int, _ints(1, 65_536)]
    log_interval_s: Annotated[float, _reals(gt=0, le=86_400)]
    shutdown_grace_s: Annotated[float, _reals(ge=0, le=3600)]
    resend_bars: Annotated[int, _ints(0, 100_000)]
    min_body_rate: Annotated[int, _ints(1, 2**30)]
    body_grace_s: Annotated[float, _reals(ge=0, le=86_400)]
    slice_bars: Annotated[int, _ints(1, 1_000_000)]


def _is_alias(value: Any) -> bool:
    """A registry alias MLflow accepts and keeps: letters, digits, '_' and '-' from a letter, at
    most 64, and none it reserves ('latest' in any case, 'v' with a number: a version's own name).
    roll.previous_alias=latest trained, committed a promotion MLflow then refused to apply, and every
    roll, rollback and register failed on that record from then on (found by a helper probing the roll)."""
    return (isinstance(value, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,63}", value) is not None
            and value.lower() != "latest" and re.fullmatch(r"[vV]\d+", value) is None)  # fmt: skip


Alias = Annotated[str, _only(_is_alias, "must be a registry alias: a letter, then up to 63 letters, digits, '_' or '-'; "
                                        "not 'latest' nor 'v' and a number (MLflow reserves them)")]  # fmt: skip


class EnsembleSection(_Strict):
    """``conf/ensemble``: the ensemble's members, how they load and how they combine."""

    models: list[str] = Field(min_length=1)  # families of conf/model/ (foxhunt.config.families)
    metric: str = Field(min_length=1)
    alias: Alias
    gate: Literal["baseline", "interval", "none"]
    versions: dict[str, Annotated[int, _ints(1, MAX_STEPS)] | None]
    registry_prefix: str = Field(min_length=1)
    rule: Literal["majority", "mean_forecast", "weighted"]
    forecast_threshold: Annotated[float, _reals(ge=0, le=1e6)]
    weights: Literal["auto", "fp32", "int8"]
    runtime: Literal["auto", "numpy", "numba", "torch"]
    runtime_probe_calls: Annotated[int, _ints(1, 1_000_000)]
    device: str = Field(pattern=r"^(cpu|cuda(:\d+)?)$")
    torch_threads: Cores | None
    split: Literal["train", "val", "test", "all"]
    experiment: str = Field(min_length=1)
    plot_equity: bool
    input_example_decided: Annotated[int, _ints(1, 100_000)]
    footprint: FootprintSection
    serve: ServeSection

    @field_validator("models")
    @classmethod
    def _registered_families(cls, value: list[str]) -> list[str]:
        known = family_names()
        unknown = [name for name in value if name not in known]
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a model family (conf/model/ has {', '.join(known)})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EnsembleSection:
        if len(set(self.models)) != len(self.models):
            raise _KeyedError("models", self.models, "a model family is listed twice")
        unknown = sorted(k for k, v in self.versions.items() if v is not None and k not in self.models)
        if unknown:
            raise _KeyedError(
                f"versions.{unknown[0]}", self.versions[unknown[0]], f"{unknown[0]} is not in ensemble.models {self.models}"
            )
        if self.metric.startswith("test/"):
            raise _KeyedError(
                "metric", self.metric, "a test metric cannot select members (the test split stays unseen); use val/..."
            )
        return self


class PaperRisk(_Strict):
    max_position: Annotated[int, _ints(0, MAX_POSITION)]  # bounded: see MAX_CAPITAL_USD
    max_daily_loss_usd: Annotated[float, _reals(gt=0, le=MAX_CAPITAL_USD)] | None
    max_drawdown_usd: Annotated[float, _reals(gt=0, le=MAX_CAPITAL_USD)] | None
    stale_minutes: Annotated[int, _ints(1, 10_080)] | None  # a week
    on_breach: Literal["stop", "pause"]


class PaperLive(_Strict):
    dataset: str = Field(min_length=1)
    schema_: Literal["ohlcv-1m"] = Field(alias="schema")
    key_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    poll_s: Annotated[float, _reals(gt=0, le=3600)]


class PaperSection(_Strict):
    """``conf/paper``: the paper-trading session (``foxhunt ensemble paper``)."""

    feed: Literal["file", "live"]
    speed: Annotated[float, _reals(ge=0, le=1e6)]
    split: Literal["train", "val", "test", "all"]
    symbol: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,32}$")] | None
    ledger: str = Field(min_length=1)
    ledger_sync: Literal["normal", "full"]
    capital_usd: Annotated[float, _reals(gt=0, le=MAX_CAPITAL_USD)]  # bounded: see MAX_CAPITAL_USD
    fill_price: Literal["next_open", "decision_close"]
    risk: PaperRisk
    live: PaperLive
    view: Literal["auto", "always", "never"]
    view_refresh_hz: Annotated[float, _reals(gt=0, le=1000)]
    experiment: str = Field(min_length=1)
    plot_equity: bool


class RollSwap(_Strict):
    poll_s: Seconds | None
    warm_bars: Annotated[int, _ints(0, 1_000_000)]
    retry_s: Seconds | None


class RollSection(_Strict):
    """``conf/roll``: the rolling loop (``foxhunt ensemble roll | rollback``) and the hot swap of a
    running ``serve`` or ``paper``."""

    window_bars: Annotated[int, _ints(1, MAX_BARS)]
    eval_bars: Annotated[int, _ints(2, MAX_BARS)]
    min_new_bars: Annotated[int, _ints(1, MAX_BARS)]
    purge_bars: Annotated[int, _ints(0, MAX_BARS)]
    min_dsr: Annotated[float, _reals(ge=0, le=1)] | None
    init: Literal["scratch", "champion"] = "scratch"
    experiment: str = Field(min_length=1)
    previous_alias: Alias
    swap: RollSwap


class EnsembleConfig(TrainConfig):
    """``conf/ensemble.yaml``: the training config plus the ensemble, paper and roll sections."""

    ensemble: EnsembleSection
    paper: PaperSection | None = None
    roll: RollSection | None = None

    @model_validator(mode="after")
    def _roll_aliases_differ(self) -> EnsembleConfig:
        if self.roll is not None and self.roll.previous_alias == self.ensemble.alias:
            raise _KeyedError(
                "roll.previous_alias", self.roll.previous_alias, f"must differ from ensemble.alias ({self.ensemble.alias})"
            )
        return self


class _KeyedError(ValueError):
    """Raised inside validators to point at a sibling field, with the value and the rule."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        super().__init__(f"{field}={value!r}: {rule}" if value is not None else f"{field}: {rule}")
        self.field = field

    @classmethod
    def of_line(cls, line: str) -> _KeyedError:
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
    # a copy of a section (callbacks.memory_budget.budget is ${budget}) repeats its problem: counted once
    problems = {(e["type"], e["msg"], repr(e.get("input"))) for e in error.errors()}
    more = len(problems) - 1
    return text + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")


def _target_class(target: str) -> Any:
    """The class (or other callable) a ``_target_`` names, imported; None where there is none."""
    module_name, _, attr = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if callable(found) else None


def _definition(target: str) -> type[Hyperparameters] | None:
    """The hyperparameters' definition of the model class ``target`` names (``hyperparameters``,
    set by :func:`foxhunt.config.model_schemas.defined_by`), or None for a class without one."""
    definition = getattr(_target_class(target), "hyperparameters", None)
    return definition if isinstance(definition, type) and issubclass(definition, Hyperparameters) else None


def check_model_hyperparameters(module: dict[str, Any]) -> None:
    """Validate ``model.module`` through the definition of the class its ``_target_`` names (a
    foxhunt model: one that has a definition); its first problem is one line naming the key."""
    definition = _definition(module["_target_"])
    if definition is None:
        raise ConfigError(f"model.module._target_={module['_target_']!r}: not a foxhunt model (its class defines no "
                          "hyperparameters: foxhunt.config.model_schemas.defined_by)")  # fmt: skip
    try:
        definition.check({key: value for key, value in module.items() if not key.startswith("_")})
    except HyperparameterError as exc:
        raise ConfigError(str(exc)) from None


def check_constructor_args(section: str, node: dict[str, Any]) -> type:
    """Import ``node['_target_']`` and check the keys against its constructor signature."""
    target = node["_target_"]
    attr = target.rpartition(".")[2]
    cls = _target_class(target)
    if cls is None:
        raise ConfigError(f"{section}._target_={target!r}: no such class")
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
    """Validate a composed training config (or an ensemble command's config, with its ``ensemble`` section);
    raise :class:`ConfigError` with one line."""
    return validate_resolved(resolved_config(cfg))


def validate_resolved(resolved: dict[str, Any]) -> TrainConfig:
    """:func:`validate` on the config already resolved to plain containers (:func:`resolved_config`)."""
    schema = EnsembleConfig if "ensemble" in resolved else TrainConfig
    trainer = resolved.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("_target_"), str):
        # a key the Trainer does not take first: +trainer.max_step=3 said "no range is known for a number under this key"
        check_constructor_args("trainer", trainer)
    try:
        parsed = schema.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(_format(exc)) from None

    check_constructor_args("trainer", resolved["trainer"])
    module = resolved["model"]["module"]
    check_constructor_args("model.module", module)
    check_model_hyperparameters(module)
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
            for key in map(str, cfg)
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
