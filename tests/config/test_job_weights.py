"""Every model family states what a training batch costs it (``model.expected_seconds_per_batch``,
the weight of its cells in a job's plan: foxhunt.jobs.launch), measured as conf/train.yaml's jobs
comment says; a family without one would be weighed at the jobs' stand-in, whatever it costs."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from configs import CONF_DIR

FAMILIES = sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml"))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_states_its_seconds_per_batch(family):
    seconds = OmegaConf.load(CONF_DIR / "model" / f"{family}.yaml").get("expected_seconds_per_batch")
    assert isinstance(seconds, float) and seconds > 0, f"conf/model/{family}.yaml: expected_seconds_per_batch={seconds!r}"
