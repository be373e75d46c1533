"""``foxhunt ensemble replay`` beside its members' training runs: the run's test Sharpe is printed as
a comparison only when the replay's bars are the bars that run was tested on (the SHA-256 of the
split's bars the run recorded); on other bars the row says it is another data set."""

from __future__ import annotations

from ensemble_helpers import DATA, SMALL, cli


def _member_rows(output: str) -> dict[str, str]:
    return {line.split()[0]: line for line in output.splitlines() if line.split()[:1] and line.split()[0] in
            {f"foxhunt-{family}-es" for family in SMALL}}  # fmt: skip


def test_the_runs_test_sharpe_is_a_comparison_only_on_the_runs_own_test_bars(store_root):
    registered = cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    assert registered.exit_code == 0, registered.output
    same = cli(store_root, "ensemble", "replay", "asset=es", *DATA, "ensemble.experiment=replay-bars")
    assert same.exit_code == 0, same.output
    rows = _member_rows(same.output)
    assert len(rows) == len(SMALL) and all("[" in row and "other bars" not in row for row in rows.values()), same.output
    # other bars of the same asset (a synthetic set of another seed): no run figure beside the replay's
    other = cli(store_root, "ensemble", "replay", "asset=es", *DATA, "data.source.seed=7", "ensemble.experiment=replay-bars")
    assert other.exit_code == 0, other.output
    rows = _member_rows(other.output)
    assert len(rows) == len(SMALL) and all("other bars" in row and "[" not in row for row in rows.values()), other.output
    assert "another data set" in other.output
