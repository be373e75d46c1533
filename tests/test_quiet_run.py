"""A quiet run: what ``foxhunt-train`` prints is one line per thing a user needs. The libraries'
notes that say nothing to a foxhunt user (filtered in :mod:`foxhunt.console`) and the figures'
details (in the run's log file) are not printed, and the Sharpe's annualization is one short line."""

from __future__ import annotations

import warnings
from pathlib import Path

from foxhunt.console import silence_known_noise
from train_entry import run_foxhunt_train

QUICK = ["trainer=smoke", "data.source.days=3"]
# What a default run printed before (2026-12-03), each a fragment of its line.
NOISE = (
    "Tight layout not applied",  # matplotlib, the memory picture
    "Detected no triton",  # torchao on a CPU build of torch
    "memory probe ",  # the three probes' statuses: to the log file
    "`weights_only` was not set",  # Lightning at every checkpoint it writes
    "The `srun` command is available on your system but is not used",  # Lightning on a machine with SLURM's tools
    "was configured so 100% of the batches will be used",  # Lightning when a limit is 1.0
)
ANNUALIZATION_LINE_MAX = 120  # characters of the printed annualization line


def test_a_default_run_prints_none_of_the_known_noise(tmp_path, monkeypatch, capfd):
    with warnings.catch_warnings(record=True) as caught:
        silence_known_noise()  # as importing foxhunt does in a fresh process (pytest undoes the filters set while it collects)
        code = run_foxhunt_train(monkeypatch, tmp_path, QUICK)
    captured = capfd.readouterr()
    assert code == 0, captured.err
    lines = [*captured.out.splitlines(), *captured.err.splitlines(), *(str(w.message) for w in caught)]
    noisy = [line for line in lines if any(noise in line for noise in NOISE)]
    assert noisy == [], "\n".join(noisy)

    annualized = [line.strip() for line in captured.out.splitlines() if "annualized" in line]
    assert len(annualized) == 1 and annualized[0].startswith("Sharpe annualized by the exchange calendar: ")
    assert len(annualized[0]) <= ANNUALIZATION_LINE_MAX, annualized[0]
    (log,) = Path(tmp_path, "outputs", "runs").glob("*/train.log")  # the details are in the run's log file
    text = log.read_text()
    assert "open minutes in 4.00 years" in text and "memory probe rss: ran" in text
