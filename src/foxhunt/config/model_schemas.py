"""The form of a model family's hyperparameter definition (``model.module.*``) and the one line
of a refusal.

Each family defines its hyperparameters once, next to its model (``DQNHyperparameters`` in
:mod:`foxhunt.models.dqn`, ...): a :class:`Hyperparameters` class with one field per key of
``model.module``, each annotated with its type, its range (both ends: generous but finite, past
them a size exhausts memory or a rate overflows) and one line of doc (``description``), none
with a default (the defaults live only in ``conf/model/<family>.yaml``). The rules between
fields are the class's ``model_validator``\\ s, raising :class:`Related`. What families share
(the forecasters' ``quantiles``, ``learning_rate``, ...; the agents' ``gamma``, ``seed``, ...) is
defined once, in :class:`foxhunt.models.forecaster.ForecasterHyperparameters` and
:class:`foxhunt.models.agent.AgentHyperparameters`, and inherited.

The model class names its definition with :func:`defined_by`, which sets the class's
``hyperparameters`` and makes its constructor validate its arguments through it (a model built
directly is checked as one built from a config). :mod:`foxhunt.config.schema` validates a
config's ``model.module`` with the definition of the class its ``_target_`` names, and the
configuration reference (``docs/hooks/reference.py``) lists every family's fields from it
(:func:`field_rule`). A refusal is one line, ``model.module.<key>=<value>: <what is allowed>``
(:class:`HyperparameterError`, a ValueError; the schema turns it into a ConfigError).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, ValidationError

# The shared upper bounds: widths and replay memories are bounded by what a machine's memory
# holds, steps by what finishes, rates and coefficients far above any value that trains.
MAX_WIDTH = 65_536  # features, hidden units, state sizes
MAX_LAYERS = 1024  # layers, heads, groups, expansion, convolution width, epochs per update
MAX_LENGTH = 100_000  # bars in a window or a chunk (as model.window in foxhunt.config.schema)
MAX_STEPS = 10_000_000  # steps between events, steps per rollout or per call
MAX_MEMORY = 100_000_000  # transitions a replay buffer holds
MAX_BATCH = 2**20  # samples in one batch
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds (np.random.seed takes < 2**32)

#: Where a family's hyperparameters sit in the config: the prefix of every refusal's key.
SECTION = "model.module"


def shown_bound(bound: int | float) -> str:
    """A range's end as a message shows it: 4294967295, 0.5, 1e12."""
    if isinstance(bound, int):
        return str(bound)
    mantissa, _, exponent = f"{bound:g}".partition("e")
    return mantissa + (f"e{int(exponent)}" if exponent else "")


class Related(ValueError):
    """A rule between fields, broken: raised by a definition's ``model_validator`` naming the key
    it refuses (``Related("epsilon_end", "must be <= model.module.epsilon_start (0.5)")``)."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(rule)
        self.key = key


class HyperparameterError(ValueError):
    """A hyperparameter refused: ``model.module.<key>=<value>: <rule>`` (without ``=<value>`` for a
    missing key)."""

    def __init__(self, key: str, value: Any, rule: str, *, missing: bool = False) -> None:
        shown = "" if missing else f"={value!r}"
        super().__init__(f"{SECTION}.{key}{shown}: {rule}")
        self.key = key


@dataclass(frozen=True)
class FieldRule:
    """What a field allows, from its annotation: ``kind`` (``int``, ``number or null``, ``list of
    int (non-empty)``, ``one of relu, tanh``, ...), ``interval`` (``[1, 1024]``, ``(0, 1)``: a
    list's items'; empty for a flag or a choice), ``phrase``, the words a refusal ends with (``an
    integer >= 1 and <= 1024``), and ``shown``, the two together as the reference says them
    (``int in [1, 1024]``, ``list of int (non-empty), each in [1, 65536]``)."""

    kind: str
    interval: str
    phrase: str
    shown: str


def _bounds(metadata: list[Any]) -> tuple[tuple[str, int | float] | None, tuple[str, int | float] | None]:
    low = high = None
    for item in metadata:
        for name, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            bound = getattr(item, name, None)
            if bound is not None:
                if name in ("ge", "gt"):
                    low = (sign, bound)
                else:
                    high = (sign, bound)
    return low, high


def _lengths(metadata: list[Any]) -> tuple[int, int | None]:
    low = next((item.min_length for item in metadata if getattr(item, "min_length", None) is not None), 0)
    high = next((item.max_length for item in metadata if getattr(item, "max_length", None) is not None), None)
    return low, high


def _rule(annotation: Any, metadata: list[Any]) -> FieldRule:
    """The rule of a type with its constraints (``metadata``: annotated-types bounds, lengths)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _rule(args[0], [*metadata, *(m for info in args[1:] for m in getattr(info, "metadata", [info]))])
    if origin in (Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        rule = _rule(inner, metadata)
        return FieldRule(f"{rule.kind} or null", rule.interval, f"{rule.phrase} or null", f"{rule.shown}, or null")
    if origin is Literal or (
        origin in (Union, types.UnionType) and all(a is bool or typing.get_origin(a) is Literal for a in args)
    ):
        # the choices as YAML writes them (a switch with a third value: bool | Literal["auto"])
        values = (
            [v for a in args for v in ((True, False) if a is bool else typing.get_args(a))] if origin is not Literal else args
        )
        choices = ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)
        return FieldRule(f"one of {choices}", "", f"one of {choices}", f"one of {choices}")
    if origin is list:
        item = _rule(args[0], [])
        fewest, most = _lengths(metadata)
        plural = item.phrase.replace("an integer", "integers").replace("a number", "numbers")
        if most is not None and fewest == most:
            size, words = f" ({fewest} items)", f"a list of {fewest} {plural}"
        else:
            size, words = (" (non-empty)" if fewest else ""), f"a {'non-empty ' if fewest else ''}list of {plural}"
        kind = f"list of {item.kind}{size}"
        return FieldRule(kind, item.interval, words, f"{kind}, each in {item.interval}" if item.interval else kind)
    if annotation is bool:
        return FieldRule("bool", "", "true or false", "bool")
    if annotation in (int, float):
        low, high = _bounds(metadata)
        kind, article = ("int", "an integer") if annotation is int else ("number", "a number")
        parts = [f"{end[0]} {shown_bound(end[1])}" for end in (low, high) if end is not None]
        interval = ""
        if low is not None and high is not None:
            interval = (
                f"{'[' if low[0] == '>=' else '('}{shown_bound(low[1])}, {shown_bound(high[1])}{']' if high[0] == '<=' else ')'}"
            )
        phrase = " ".join([article, " and ".join(parts)]).strip()
        return FieldRule(kind, interval, phrase, f"{kind} in {interval}" if interval else kind)
    raise TypeError(f"no rule text for the hyperparameter type {annotation!r}")


def field_rule(definition: type[Hyperparameters], name: str) -> FieldRule:
    """What field ``name`` of ``definition`` allows (its type and range, as the refusal and the
    reference docs say it)."""
    info = definition.model_fields[name]
    return _rule(info.annotation, list(info.metadata))


def _plain(value: Any) -> Any:
    """OmegaConf containers (Hydra passes them to a constructor) as plain lists and dicts."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


class Hyperparameters(BaseModel):
    """Base of a family's definition (see the module doc). Strict: an integer is an int (not
    1.0, not true), a number is finite, a flag is a bool, an unknown key is refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @classmethod
    def check(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` (every hyperparameter, by key) validated: plain Python values (lists, floats
        for numbers); the first problem raises :class:`HyperparameterError`."""
        plain = {key: _plain(value) for key, value in values.items()}
        try:
            return cls.model_validate(plain).model_dump()
        except ValidationError as exc:
            raise cls._refusal(exc.errors()[0], plain) from None

    @classmethod
    def refused_keys(cls, values: Mapping[str, Any]) -> set[str]:
        """The keys whose own value (its type or range, not a rule between keys) is refused."""
        try:
            cls.model_validate({key: _plain(value) for key, value in values.items()})
        except ValidationError as exc:
            return {str(error["loc"][0]) for error in exc.errors() if error["loc"] and error["type"] != "missing"}
        return set()

    @classmethod
    def _refusal(cls, error: Any, values: Mapping[str, Any]) -> HyperparameterError:
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, Related):
            return HyperparameterError(cause.key, values.get(cause.key), str(cause))
        key = str(error["loc"][0])
        if error["type"] == "missing":
            return HyperparameterError(key, None, f"missing (required by {cls.__name__})", missing=True)
        if error["type"] == "extra_forbidden":
            return HyperparameterError(
                key, values[key], f"not a hyperparameter of {cls.__name__} (allowed: {', '.join(cls.model_fields)})"
            )
        if isinstance(cause, ValueError):  # a field's own validator (the quantiles' order)
            return HyperparameterError(key, values[key], str(cause))
        return HyperparameterError(key, values[key], f"must be {field_rule(cls, key).phrase}")


M = TypeVar("M", bound=type)


def defined_by(definition: type[Hyperparameters]) -> Callable[[M], M]:
    """Class decorator of a model: ``definition`` is its hyperparameters (the class's
    ``hyperparameters``), and its constructor validates its arguments through it, in one call,
    before its body runs (which then gets the validated, plain values: lists, not OmegaConf's).
    The constructor's parameters must be the definition's fields, no more, no fewer."""

    def decorate(cls: M) -> M:
        init = cls.__dict__.get("__init__")  # the class's own constructor
        if init is None:
            raise TypeError(f"{cls.__name__} defines no __init__ of its own: nothing takes its hyperparameters")
        signature = inspect.signature(init)
        parameters = [name for name in signature.parameters][1:]  # after self
        if set(parameters) != set(definition.model_fields):
            raise TypeError(f"{cls.__name__}.__init__ takes {sorted(parameters)}, {definition.__name__} defines "
                            f"{sorted(definition.model_fields)}: a hyperparameter must be in both")  # fmt: skip

        @functools.wraps(init)
        def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
            arguments = signature.bind(self, *args, **kwargs).arguments  # a TypeError, as any call, for a missing one
            init(self, **definition.check({name: arguments[name] for name in parameters}))

        setattr(cls, "__init__", checked_init)  # noqa: B010 - a method assigned to its class
        setattr(cls, "hyperparameters", definition)  # noqa: B010
        return cls

    return decorate
