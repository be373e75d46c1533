"""Value rules for model hyperparameters (``model.module.*``).

The four model families share a vocabulary (``lr``, ``gamma``, ``dropout``, ``hidden_sizes``,
``quantiles``, ...): one rule per parameter name covers them all, so a new model is checked
as soon as it uses the common names. Every rule has a range with both ends (the upper ones
generous but finite: past them a size exhausts memory or a rate overflows), and a number
under a name no rule matches is refused: every numeric hyperparameter has a range. Rules
that relate several parameters of one model (heads dividing the hidden size, a batch no
larger than the replay buffer) follow per model. Each violation raises
:class:`~foxhunt.config.schema.ConfigError` with one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from foxhunt.errors import ConfigError


def shown_bound(bound: int | float) -> str:
    """A range's end as a message shows it: 4294967295, 0.5, 1e12."""
    if isinstance(bound, int):
        return str(bound)
    mantissa, _, exponent = f"{bound:g}".partition("e")
    return mantissa + (f"e{int(exponent)}" if exponent else "")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(low: int, high: int) -> Callable[[Any], str | None]:
    """An integer in [low, high]."""
    rule = f"must be an integer >= {low} and <= {high}"
    return lambda v: None if isinstance(v, int) and not isinstance(v, bool) and low <= v <= high else rule


def _real(low: float, high: float, *, low_open: bool = False) -> Callable[[Any], str | None]:
    """A finite number in [low, high] (``low_open``: in (low, high])."""
    rule = f"must be a number {'>' if low_open else '>='} {shown_bound(low)} and <= {shown_bound(high)}"

    def check(v: Any) -> str | None:
        return None if _number(v) and (v > low if low_open else v >= low) and v <= high else rule

    return check


def _integer_list(low: int, high: int) -> Callable[[Any], str | None]:
    """A non-empty list of integers in [low, high] (layer widths)."""
    element, rule = _integer(low, high), f"must be a non-empty list of integers >= {low} and <= {high}"
    return lambda v: None if isinstance(v, (list, tuple)) and len(v) > 0 and all(element(x) is None for x in v) else rule


def _unit_open_closed(v: Any) -> str | None:
    return None if _number(v) and 0 < v <= 1 else "must be in (0, 1]"


def _unit_closed(v: Any) -> str | None:
    return None if _number(v) and 0 <= v <= 1 else "must be in [0, 1]"


def _dropout(v: Any) -> str | None:
    return None if _number(v) and 0 <= v < 1 else "must be in [0, 1)"


def _quantiles(v: Any) -> str | None:
    if not (isinstance(v, (list, tuple)) and v and all(_number(q) and 0 < q < 1 for q in v)):
        return "must be a non-empty list of numbers in (0, 1)"
    if list(v) != sorted(set(v)):
        return "must be strictly increasing"
    if not any(math.isclose(q, 0.5) for q in v):
        return "must include the median 0.5 (positions follow the median forecast)"
    return None


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


MAX_INIT_RANGE = 1e4  # the SSM's A = -exp(A_log), A_log = log(U[low, high])


def _range_pair(v: Any) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(x) and x > 0 for x in v) and v[0] <= v[1] <= MAX_INIT_RANGE
    return None if ok else f"must be [low, high] with 0 < low <= high <= {shown_bound(MAX_INIT_RANGE)}"


def _holds_number(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_number(v) for v in value)
    if isinstance(value, Mapping):
        return any(_holds_number(v) for v in value.values())
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The upper bounds: generous, finite. Widths (features, hidden units) and replay memories are
# bounded by what a machine's memory holds, steps by what finishes, rates and coefficients far
# above any value that trains (a larger one overflows the loss or the weights).
WIDTH = _integer(1, 65_536)  # features, hidden units, state sizes
LAYERS = _integer(1, 1024)  # layers, heads, groups, expansion, convolution width, epochs per update
LENGTH = _integer(1, 100_000)  # bars in a window or a chunk (as model.window in foxhunt.config.schema)
STEPS = _integer(1, 10_000_000)  # steps between events, steps per rollout or call
MEMORY = 100_000_000  # transitions a replay buffer holds

# (pattern on the parameter name, rule). First match wins; a name that matches nothing and
# holds a number is refused (no range known), any other value is left to the constructor.
NAME_RULES: list[tuple[str, Callable[[Any], str | None]]] = [
    (r"^(lr|.*_lr|learning_rate)$", _real(0, 10, low_open=True)),
    (r"^(gamma|gae_lambda|lam|lambda_)$", _unit_open_closed),
    (r"^dropout$", _dropout),
    (r"^epsilon_decay$", _unit_open_closed),
    (r"^epsilon_(start|end|min|final)$", _unit_closed),
    (r"^quantiles$", _quantiles),
    (r"^A_init_range$", _range_pair),
    (r"^activation_checkpointing$", _boolean),
    (r"^(dt_min|dt_max|dt_init_floor)$", _real(0, 10, low_open=True)),
    (r"^(eps|.*_eps)$", _real(0, 1, low_open=True)),  # the epsilons of norms and optimizers
    (r"^hidden_sizes$|^.*_hidden_sizes$", _integer_list(1, 65_536)),
    (r"^(seed)$", _integer(0, 2**32 - 1)),  # numpy's and torch's seeds
    (r"^(min_replay|min_replay_size|warmup_steps)$", _integer(0, MEMORY)),
    (r"^(replay_capacity|capacity)$", _integer(1, MEMORY)),
    (r"^(batch_size|minibatch_size)$", _integer(1, 2**20)),
    (r"^(horizon|seq_len|chunk_size|moving_average)$", LENGTH),
    (r"^(num_heads|n_heads|heads|lstm_layers|n_layers|num_layers|expand|d_conv|ngroups|update_epochs)$", LAYERS),
    (r"^(rollout_steps|steps_per_call|.*_every|.*_interval)$", STEPS),
    (
        r"^(.*_dim|dim|d_model|d_state|headdim|hidden|hidden_size|num_actions|n_actions|num_envs|"
        r"n_static|n_known|n_observed|num_static|num_known|num_observed)$",
        WIDTH,
    ),
    (r"^(weight_decay|l2)$", _real(0, 10)),
    (r"^(clip.*|.*_coef|target_kl)$", _real(0, 100)),
    (r"^(max_grad_norm|grad_clip.*|huber_delta)$", _real(0, 1e6)),
    (r"^position_threshold$", _real(0, 1e6)),  # target-scale units: the summed median forecast
]


def rule_problem(name: str, value: Any) -> str | None:
    """What is wrong with ``value`` for the hyperparameter ``name`` (None: nothing): the first rule
    of :data:`NAME_RULES` whose pattern matches; a number under a name no rule matches has no range."""
    for pattern, rule in NAME_RULES:
        if re.match(pattern, name):
            return rule(value)
    if _holds_number(value):
        return "no range is known for a numeric hyperparameter of this name (foxhunt.config.model_schemas.NAME_RULES holds one rule per name)"
    return None


def _check_names(module: Mapping[str, Any]) -> None:
    for name, value in module.items():
        if name.startswith("_") or value is None:
            continue
        problem = rule_problem(name, value)
        if problem:
            raise ConfigError(f"model.module.{name}={value!r}: {problem}")


def _require(condition: bool, key: str, value: Any, rule: str) -> None:
    if not condition:
        raise ConfigError(f"model.module.{key}={value!r}: {rule}")


def _first(module: Mapping[str, Any], *names: str) -> tuple[str | None, Any]:
    for name in names:
        if name in module:
            return name, module[name]
    return None, None


def _check_relations(module: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """Rules between parameters, by the names the model families use."""
    hidden_key, hidden = _first(module, "hidden_size", "hidden", "d_model")
    heads_key, heads = _first(module, "num_heads", "n_heads", "heads")
    if hidden_key and heads_key and _number(hidden) and _number(heads) and heads:
        _require(hidden % heads == 0, heads_key, heads, f"must divide model.module.{hidden_key} ({hidden})")

    start_key, start = _first(module, "epsilon_start")
    end_key, end = _first(module, "epsilon_end", "epsilon_min", "epsilon_final")
    if start_key and end_key and _number(start) and _number(end):
        _require(end <= start, end_key, end, f"must be <= model.module.{start_key} ({start})")

    cap_key, cap = _first(module, "replay_capacity", "capacity")
    batch_key, batch = _first(module, "batch_size")
    if cap_key and batch_key and _number(cap) and _number(batch):
        _require(batch <= cap, batch_key, batch, f"must be <= model.module.{cap_key} ({cap})")
    min_key, min_replay = _first(module, "min_replay", "min_replay_size")
    if cap_key and min_key and _number(cap) and _number(min_replay):
        _require(min_replay <= cap, min_key, min_replay, f"must be <= model.module.{cap_key} ({cap})")

    mini_key, mini = _first(module, "minibatch_size")
    envs = (model.get("env") or {}).get("num_envs")
    steps_key, steps = _first(module, "rollout_steps")
    if mini_key and steps_key and _number(mini) and _number(steps) and _number(envs):
        rollout = steps * envs
        _require(
            rollout % mini == 0 and mini <= rollout,
            mini_key,
            mini,
            f"must divide the rollout batch model.env.num_envs x model.module.{steps_key} ({rollout})",
        )

    d_model, expand, headdim = module.get("d_model"), module.get("expand"), module.get("headdim")
    if all(_number(x) for x in (d_model, expand, headdim)) and headdim:
        _require(
            (d_model * expand) % headdim == 0,
            "headdim",
            headdim,
            f"must divide d_model x expand ({d_model * expand})",
        )
    ngroups, nheads = module.get("ngroups"), None
    if all(_number(x) for x in (d_model, expand, headdim, ngroups)) and headdim and ngroups:
        nheads = d_model * expand // headdim
        _require(nheads % ngroups == 0, "ngroups", ngroups, f"must divide the number of SSM heads ({nheads})")

    window, seq_len = module.get("moving_average"), module.get("seq_len")
    if _number(window) and _number(seq_len):
        _require(
            window % 2 == 1 and window <= seq_len,
            "moving_average",
            window,
            f"must be odd and <= model.module.seq_len ({seq_len})",
        )

    input_dim = module.get("input_dim")
    for names in (("static_dim", "known_dim", "observed_dim"), ("n_static", "n_known", "n_observed")):
        counts = [module.get(k) for k in names]
        if input_dim is not None and all(_number(c) for c in counts):
            _require(
                sum(counts) == input_dim,
                "input_dim",
                input_dim,
                f"must equal {' + '.join(names)} ({sum(counts)})",
            )


def validate_model_hyperparameters(cls: type, module: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    _check_names(module)
    _check_relations(module, model)
