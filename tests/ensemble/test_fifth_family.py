"""A family outside the default ensemble, with no ensemble code of its own (DLinear, the fifth):
registered, replayed as its training run scored the same bars, and exported, all through the
command line, as a user adds a family to ``ensemble.models``."""

from __future__ import annotations

import json

import pytest
from ensemble_helpers import DATA, FIFTH, cli, client

MODELS = f"ensemble.models=[{FIFTH}]"


def test_the_fifth_family_registers_replays_as_its_run_and_exports(store_root, tmp_path):
    registered = cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none", MODELS)
    assert registered.exit_code == 0, registered.output
    c = client(store_root)
    champion = c.get_model_version_by_alias(f"foxhunt-{FIFTH}-es", "champion")

    replayed = cli(store_root, "ensemble", "replay", "asset=es", MODELS, "ensemble.experiment=fifth-family", *DATA)
    assert replayed.exit_code == 0, replayed.output
    (run,) = c.search_runs([c.get_experiment_by_name("fifth-family").experiment_id])
    trained = c.get_run(champion.run_id).data.metrics  # the ensemble's backtest of the test split = the run's own
    assert run.data.metrics[f"foxhunt-{FIFTH}-es/pnl"] == pytest.approx(trained["test/pnl"])
    assert run.data.metrics[f"foxhunt-{FIFTH}-es/sharpe"] == pytest.approx(trained["test/sharpe"])

    exported = cli(store_root, "ensemble", "export", "asset=es", MODELS, "--format", "onnx", "--out", str(tmp_path))
    assert exported.exit_code == 0, exported.output
    spec = json.loads((tmp_path / f"foxhunt-{FIFTH}-es-v{champion.version}" / "member.json").read_text())
    assert spec["decision"]["rule"] == "median_sum" and [i["name"] for i in spec["inputs"]] == ["static", "known", "observed"]
