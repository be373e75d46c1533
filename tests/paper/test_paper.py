"""foxhunt ensemble paper: PnL equal to replay's backtest, the ledger, the limits, bad input."""

from __future__ import annotations

import sqlite3

import pytest
from ensemble_helpers import cli, client

from conftest import ENSEMBLE


def _ledger(path):
    conn = sqlite3.connect(path)
    try:
        fills = conn.execute(
            "SELECT id, order_id, ts_ns, quantity, price, commission, kind, gap_usd FROM fills ORDER BY id"
        ).fetchall()
        account = conn.execute("SELECT position, cash, mark, pending_order FROM accounts").fetchall()
        bars = conn.execute("SELECT COUNT(*), SUM(trade) FROM bars").fetchone()
        events = conn.execute("SELECT kind, message FROM events").fetchall()
        return {"fills": fills, "account": account, "bars": bars, "events": events}
    finally:
        conn.close()


def _equity(path) -> float:
    conn = sqlite3.connect(path)
    try:
        position, cash, mark, _ = conn.execute("SELECT position, cash, mark, pending_order FROM accounts").fetchone()
        return cash + position * mark * 50.0
    finally:
        conn.close()


def _replay_pnl(root) -> float:
    result = cli(root, "ensemble", "replay", *ENSEMBLE, "ensemble.experiment=paper-replay")
    assert result.exit_code == 0, result.output
    runs = client(root).search_runs([client(root).get_experiment_by_name("paper-replay").experiment_id])
    return runs[0].data.metrics["ensemble/pnl"]


def test_paper_pnl_equals_the_replay_backtest_to_the_cent(paper_store, tmp_path):
    replay = _replay_pnl(paper_store)
    close = tmp_path / "close.sqlite"
    result = cli(paper_store, "ensemble", "paper", *ENSEMBLE, f"paper.ledger={close}", "paper.fill_price=decision_close",
                 "paper.risk.max_daily_loss_usd=null", "paper.risk.max_drawdown_usd=null")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert round(_equity(close) - 100000.0, 2) == round(replay, 2)
    opened = tmp_path / "open.sqlite"
    result = cli(paper_store, "ensemble", "paper", *ENSEMBLE, f"paper.ledger={opened}",
                 "paper.risk.max_daily_loss_usd=null", "paper.risk.max_drawdown_usd=null")  # fmt: skip
    assert result.exit_code == 0, result.output
    book = _ledger(opened)
    gap = sum(f[7] for f in book["fills"])
    assert len(book["fills"]) == len(_ledger(close)["fills"]) > 0
    # next_open: the backtest's PnL less each fill's opening gap, to the cent
    assert round(_equity(opened) - 100000.0 + gap, 2) == round(replay, 2)
    assert "MLflow run" in result.output
    run = client(paper_store).search_runs([client(paper_store).get_experiment_by_name("paper").experiment_id])[0]
    artifacts = {a.path for a in client(paper_store).list_artifacts(run.info.run_id)}
    assert {"fills.csv", "equity_paper.png", "paper.md"} <= artifacts
    assert run.data.metrics["paper/fills"] == len(book["fills"])
    again = cli(paper_store, "ensemble", "paper", *ENSEMBLE, f"paper.ledger={opened}",
                "paper.risk.max_daily_loss_usd=null", "paper.risk.max_drawdown_usd=null")  # fmt: skip
    assert again.exit_code == 0, again.output  # resumed, no new bar: nothing measured, said so (it printed "p50 nan us")
    assert "no bar stepped, nothing measured" in again.output and " nan " not in again.output, again.output


def test_a_breach_flattens_records_why_and_stops(paper_store, tmp_path):
    ledger = tmp_path / "risk.sqlite"
    result = cli(
        paper_store, "ensemble", "paper", *ENSEMBLE, f"paper.ledger={ledger}", "paper.risk.max_position=0", "logger.enabled=false"
    )
    assert result.exit_code == 0, result.output
    book = _ledger(ledger)
    assert book["account"][0][0] == 0 and book["account"][0][3] is None
    assert book["events"] and book["events"][0][0] == "breach" and "max position" in book["events"][0][1]
    assert book["fills"] == [] and book["bars"][1] < 595  # stopped before the split's end
    assert "stopped by a risk limit: max position" in result.output


def test_a_daily_loss_breach_pauses_until_the_next_trading_date(paper_store, tmp_path):
    ledger = tmp_path / "pause.sqlite"
    result = cli(paper_store, "ensemble", "paper", *ENSEMBLE, f"paper.ledger={ledger}", "paper.risk.max_daily_loss_usd=1",
                 "paper.risk.on_breach=pause", "logger.enabled=false")  # fmt: skip
    assert result.exit_code == 0, result.output
    book = _ledger(ledger)
    kinds = [k for k, _ in book["events"]]
    assert "breach" in kinds and "max daily loss" in dict(book["events"])["breach"]
    assert book["bars"][1] == 595  # paused, not stopped: every bar of the split read


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=databento", "data.source.path=/no/such/file.dbn"], "file.dbn: file not found"),
        (["paper.symbol=NQ.FUT"], "paper.symbol=NQ.FUT: the ensemble was trained on es"),
        (["paper.speed=-1"], "paper.speed=-1"),
    ],
)
def test_bad_input_is_one_line_and_writes_no_ledger(paper_store, tmp_path, overrides, message):
    ledger = tmp_path / "bad.sqlite"
    base = [a for a in ENSEMBLE if not (a.startswith("data.source.days") and any(o.startswith("data=") for o in overrides))]
    result = cli(paper_store, "ensemble", "paper", *base, f"paper.ledger={ledger}", *overrides)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message.lower() in lines[0].lower(), result.output
    assert not ledger.exists()


def test_an_off_grid_or_out_of_order_file_writes_no_ledger(paper_store, tmp_path):
    import pandas as pd

    rows = pd.DataFrame({"timestamp_utc": pd.date_range("2024-01-02 15:00", periods=5, freq="1min", tz="UTC").astype(str),
                         "open": 4800.0, "high": 4801.0, "low": 4799.0, "close": 4800.0, "volume": 10.0})  # fmt: skip
    for name, edit in (("offgrid", lambda f: f.assign(close=[4800.0, 4800.1, 4800.0, 4800.0, 4800.0])),
                       ("order", lambda f: f.iloc[[0, 2, 1, 3, 4]])):  # fmt: skip
        path = tmp_path / f"{name}.csv"
        edit(rows).to_csv(path, index=False)
        ledger = tmp_path / f"{name}.sqlite"
        result = cli(paper_store, "ensemble", "paper", *ENSEMBLE[:-1], "data=csv", f"data.source.path={path}", "paper.split=all",
                     f"paper.ledger={ledger}")  # fmt: skip
        assert result.exit_code == 2, result.output
        assert len([x for x in result.output.splitlines() if x.strip()]) == 1, result.output
        assert not ledger.exists()


def _csv(path, seed: int, n: int = 60) -> None:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    close = 4800.0 + 0.25 * np.cumsum(rng.integers(-4, 5, n))
    open_ = np.concatenate([[4800.0], close[:-1]])
    pd.DataFrame({"timestamp_utc": pd.date_range("2024-01-02 15:00", periods=n, freq="1min", tz="UTC").astype(str),
                  "open": open_, "high": np.maximum(open_, close) + 0.25, "low": np.minimum(open_, close) - 0.25,
                  "close": close, "volume": 10.0}).to_csv(path, index=False)  # fmt: skip


def test_another_data_file_rule_session_or_an_edited_account_is_one_line_and_the_ledger_stays(paper_store, tmp_path):
    """A ledger is one session's: the same source class on another file, another combination
    rule, a second session while the first runs, an account its fills do not explain: each exit 2
    in one line, the ledger byte for byte as it was."""
    from foxhunt.paper.ledger import Ledger

    first, other = tmp_path / "a.csv", tmp_path / "b.csv"
    _csv(first, 1)
    _csv(other, 2)
    ledger = tmp_path / "csv.sqlite"
    args = [*ENSEMBLE[:-1], "data=csv", "paper.split=all", f"paper.ledger={ledger}", "logger.enabled=false"]
    made = cli(paper_store, "ensemble", "paper", *args, f"data.source.path={first}")
    assert made.exit_code == 0, made.output

    def refused(*overrides: str, text: str) -> None:
        before = ledger.read_bytes()
        result = cli(paper_store, "ensemble", "paper", *args, *overrides)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and text in lines[0], result.output
        assert ledger.read_bytes() == before

    refused(f"data.source.path={other}", text="made with data=sha256:")
    refused(f"data.source.path={first}", "ensemble.rule=mean_forecast", text="made with rule=")
    conn = sqlite3.connect(ledger)
    identity = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    conn.close()
    holder = Ledger(ledger, identity)
    holder.open()
    try:
        refused(f"data.source.path={first}", text="in use by another paper session")
    finally:
        holder.close()
    conn = sqlite3.connect(ledger)
    conn.execute("UPDATE accounts SET cash = cash + 1000")
    conn.commit()
    conn.close()
    refused(f"data.source.path={first}", text="accounts ES.FUT: cash")
    resumed = cli(
        paper_store, "ensemble", "paper", *args, f"data.source.path={first}", "paper.ledger=" + str(tmp_path / "new.sqlite")
    )
    assert resumed.exit_code == 0, resumed.output


def test_a_refused_live_attempt_writes_nothing_and_the_default_file_session_then_runs(paper_store, monkeypatch):
    """``paper.feed=live`` without an API key, or without the ``databento`` package: each one line,
    exit 2, and nothing written (a refused attempt without the package wrote a ledger stamped live at
    the default path, which then refused the default file session: 'made with feed=live:...')."""
    import sys

    ledger = paper_store / "paper" / "es.sqlite"
    assert not ledger.exists()
    monkeypatch.delenv("DATABENTO_API_KEY", raising=False)
    monkeypatch.setitem(sys.modules, "databento", None)  # not installed: its import raises ImportError
    for key, message in ((None, "no API key in $DATABENTO_API_KEY"), ("db-test", "the databento package is not installed")):
        if key is not None:
            monkeypatch.setenv("DATABENTO_API_KEY", key)
        result = cli(paper_store, "ensemble", "paper", *ENSEMBLE, "paper.feed=live", "logger.enabled=false")
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
        assert not ledger.exists() and not ledger.parent.exists(), f"{ledger} written by a refused live attempt"
    result = cli(paper_store, "ensemble", "paper", *ENSEMBLE, "logger.enabled=false", "paper.view=never")
    assert result.exit_code == 0, result.output
    assert ledger.exists() and "the feed ended" in result.output
