"""A precision policy owns its rules: it refuses an incoherent combination with one line naming
the key, and the config schema refuses exactly what the policy refuses (it checks by building
one), with the same line."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from foxhunt.config.schema import ConfigError, PrecisionSection, validate
from foxhunt.precision.policy import (
    LIGHTNING_PRECISIONS,
    OPTIMIZER_STATE_FORMATS,
    QUANTIZABLE_TYPES,
    WEIGHT_FORMATS,
    PrecisionPolicy,
)

INT8 = dict(
    name="int8", trainer_precision="32-true", weights="int8", optimizer_states="fp8",
    min_quantized_numel=4096, keep_fp32=["*head*"], quantize_types=["Linear", "LSTM"], optimizer_block_size=256,
)  # fmt: skip


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"optimizer_states": "32bit"}, "int8 weights need 8-bit optimizer states"),
        ({"trainer_precision": "bf16-mixed"}, "int8 weights train under 32-true"),
        ({"quantize_types": ["Conv1d"]}, "precision.quantize_types='Conv1d'"),
        ({"min_quantized_numel": None}, "precision.min_quantized_numel=None"),
        ({"optimizer_block_size": None}, "precision.optimizer_block_size=None: 8-bit optimizer states need a block size"),
    ],
)
def test_policy_rejects_an_incoherent_int8_config(changes, message):
    with pytest.raises(ValueError, match=message):
        PrecisionPolicy(**{**INT8, **changes})


def test_schema_names_the_precision_key(compose_cfg):
    with pytest.raises(ConfigError, match=r"^precision.optimizer_states='32bit': int8 weights need 8-bit"):
        validate(compose_cfg(["precision=int8", "precision.optimizer_states=32bit"]))
    with pytest.raises(ConfigError, match=r"^precision.weights='int4'"):
        validate(compose_cfg(["precision=int8", "precision.weights=int4"]))


fields = st.fixed_dictionaries(
    {
        "trainer_precision": st.sampled_from(LIGHTNING_PRECISIONS),
        "weights": st.sampled_from(WEIGHT_FORMATS),
        "optimizer_states": st.sampled_from(OPTIMIZER_STATE_FORMATS),
        "optimizer_block_size": st.one_of(st.none(), st.integers(1, 1024)),
        "min_quantized_numel": st.one_of(st.none(), st.integers(1, 10_000)),
        "quantize_types": st.lists(st.sampled_from(QUANTIZABLE_TYPES), max_size=2, unique=True),
    }
)


@settings(max_examples=200, deadline=None)
@given(fields)
def test_the_schema_refuses_exactly_what_the_policy_refuses_with_its_line(values):
    try:
        PrecisionPolicy(name="p", **values)
        policy_line = None
    except ValueError as exc:
        policy_line = str(exc)
    try:
        PrecisionSection.model_validate({"_target_": "foxhunt.precision.policy.PrecisionPolicy", "name": "p", **values})
        schema_line = None
    except ValidationError as exc:
        (error,) = exc.errors()
        schema_line = str(error["ctx"]["error"])
    assert schema_line == (None if policy_line is None else policy_line.removeprefix("precision."))
    if policy_line is not None:
        key = policy_line.removeprefix("precision.").split(":", 1)[0].split("=", 1)[0]
        assert key in values, policy_line  # the line names a key the user set
