"""foxhunt.config.sections: a config section read into a dataclass from the dataclass itself, a
mapping or a DictConfig (interpolations resolved), an unknown or missing key one line naming the
section and the key."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from foxhunt.config.sections import dataclass_values


@dataclasses.dataclass
class Window:
    bars: int
    label: str
    gap: int = 3
    tags: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Other:
    bars: int
    label: str


def test_every_source_gives_the_fields_it_sets():
    want = {"bars": 5, "label": "a"}
    assert dataclass_values(Window, {"label": "a", "bars": 5}, "w") == want  # the defaults are left to the constructor
    cfg = OmegaConf.create({"root": {"n": 5}, "w": {"bars": "${root.n}", "label": "a"}})
    assert dataclass_values(Window, cfg.w, "w") == want  # resolved against the whole config
    assert dataclass_values(Window, Other(5, "a"), "w") == want  # another dataclass's fields
    full = Window(5, "a", 7, ["x"])
    assert dataclass_values(Window, full, "w") == {"bars": 5, "label": "a", "gap": 7, "tags": ["x"]}
    assert Window(**dataclass_values(Window, {"bars": 1, "label": "b", "gap": 0}, "w")) == Window(1, "b", 0, [])


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"bars": 5, "label": "a", "zeta": 1, "beta": 2}, "w.beta: unknown key (known keys: bars, label, gap, tags)"),
        ({"label": "a", "gap": 1}, "w.bars: missing key"),
        ({"bars": 5}, "w.label: missing key"),
        (OmegaConf.create({"bars": 5, "label": "a", "extra": None}), "w.extra: unknown key"),
        (7, "w: expected a mapping, got int"),
        ([("bars", 5)], "w: expected a mapping, got list"),
    ],
)
def test_a_bad_section_is_one_line_naming_the_key(cfg, message):
    with pytest.raises(ValueError) as error:
        dataclass_values(Window, cfg, "w")
    assert str(error.value).startswith(message)
