"""foxhunt.paper.ledger: what a restart loads is exactly what was booked (positions, cash, mark,
the pending order, the risk state); a bar's transaction is all or nothing, also under kill -9;
another session's ledger is refused in one line."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paper_bars import CAPITAL, ES, MINUTE_NS, START_NS, bar, bar_paths, refused

from foxhunt.paper.fills import Account, FillModel, Order
from foxhunt.paper.ledger import KILL_ENV, Ledger
from foxhunt.paper.risk import RiskState

IDENTITY = {"asset": "es", "members": "foxhunt-dqn-es:1", "feed": "synthetic:test", "symbol": "ES.FUT",
            "fill_price": "next_open", "commission_usd": 2.25, "slippage_ticks": 1.0, "capital_usd": CAPITAL}  # fmt: skip


def ts(i: int) -> int:
    return START_NS + i * MINUTE_NS


def book(ledger: Ledger, bars, targets, model=None) -> tuple[Account, RiskState, int]:
    """Run the bars through a fill model, booking each in the ledger as the paper loop does."""
    model = model or FillModel(ES, 2.25, 1.0, "next_open")
    account = Account("ES.FUT", cash=CAPITAL, multiplier=ES.multiplier)
    risk = RiskState(day="2024-03-12", day_start=CAPITAL, peak=CAPITAL)
    fills = 0
    for b, target in zip(bars, targets):
        made = model.on_bar(account, b)
        fills += len(made)
        risk.peak = max(risk.peak, account.equity)
        order = model.order(account, b, target, "signal")
        account.pending = order
        ledger.record_bar(b, account, made, order, risk, [], target, 1_000, 2_000)
    return account, risk, fills


def opened(path: Path, identity=IDENTITY) -> Ledger:
    ledger = Ledger(path, identity)
    ledger.open()
    return ledger


@settings(max_examples=25, deadline=None)
@given(bar_paths(max_bars=25).flatmap(lambda bars: st.tuples(
    st.just(bars), st.lists(st.integers(-2, 2), min_size=len(bars), max_size=len(bars)))))  # fmt: skip
def test_a_restart_loads_exactly_what_was_booked(tmp_path_factory, case):
    bars, targets = case
    path = tmp_path_factory.mktemp("ledger") / "paper.sqlite"
    ledger = opened(path)
    account, risk, fills = book(ledger, bars, targets)
    ledger.close()
    again = opened(path)
    try:
        loaded = again.load(ES.multiplier)
        got = loaded.accounts["ES.FUT"]
        assert (got.position, got.cash, got.mark, got.pending) == (account.position, account.cash, account.mark, account.pending)
        assert got.equity == account.equity
        assert loaded.risk == risk and loaded.fills == fills
        assert [row[:2] for row in loaded.bars] == [(b.symbol, b.ts_ns) for b in bars]
        assert [row[8] for row in loaded.bars] == targets
        # every trade fill points at the order it filled, and that order is marked filled on the fill's bar
        rows = again.conn.execute("SELECT f.quantity, f.ts_ns, o.quantity, o.filled_ts_ns FROM fills f "
                                  "JOIN orders o ON o.id = f.order_id WHERE f.kind = 'trade'").fetchall()  # fmt: skip
        trades = again.conn.execute("SELECT COUNT(*) FROM fills WHERE kind = 'trade'").fetchone()[0]
        assert len(rows) == trades and all(fq == oq and fts == ots for fq, fts, oq, ots in rows)
        # the equity booked with each bar is its cash plus the position at its raw close
        for ts, position, equity, *_ in again.equity_rows():
            close = next(b.raw_close for b in bars if b.ts_ns == ts)
            cash = again.conn.execute("SELECT cash FROM bars WHERE ts_ns = ?", (ts,)).fetchone()[0]
            assert equity == pytest.approx(cash + position * close * ES.multiplier)
    finally:
        again.close()


def test_a_failed_bar_transaction_leaves_nothing_of_that_bar(tmp_path):
    """The last statement of a bar's transaction fails (an event without a message breaks the
    events table's NOT NULL): the bar, its fills, its order and the account it wrote are all
    rolled back, and the ledger goes on from the bar before."""
    ledger = opened(tmp_path / "paper.sqlite")
    bars = [bar(0, 4800.0, 4800.25), bar(1, 4800.5, 4801.0)]
    account, risk, _ = book(ledger, bars, [1, -1])  # a long filled on bar 1, a sell pending
    model = FillModel(ES, 2.25, 1.0, "next_open")
    before = ledger.load(ES.multiplier)
    fills = model.on_bar(account, bar(2, 4802.0, 4802.5))
    assert fills and account.position == -1
    with pytest.raises(sqlite3.IntegrityError, match="events.message"):
        ledger.record_bar(bar(2, 4802.0, 4802.5), account, fills, model.order(account, bar(2, 4802.0, 4802.5), 0, "signal"),
                          risk, [("breach", None)], 0, 0, 0)  # fmt: skip
    after = ledger.load(ES.multiplier)
    assert after.accounts["ES.FUT"] == before.accounts["ES.FUT"] and after.accounts["ES.FUT"].position == 1
    assert (after.fills, after.bars, after.events) == (before.fills, before.bars, before.events)
    assert ledger.conn.execute("SELECT COUNT(*), COUNT(filled_ts_ns) FROM orders").fetchone() == (2, 1)
    ledger.close()


KILLED = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from paper_bars import bar
    from test_ledger import IDENTITY, book, opened
    ledger = opened(Path({path!r}))
    book(ledger, [bar(i, 4800.0 + i, 4800.25 + i) for i in range(6)], [1, 1, -1, 0, 1, 1])
""")


@pytest.mark.parametrize(("phase", "stored"), [("before_commit", 2), ("after_commit", 3)])
def test_kill_9_inside_a_bar_keeps_every_committed_bar_and_nothing_of_the_next(tmp_path, phase, stored):
    path = tmp_path / "paper.sqlite"
    script = KILLED.format(tests=str(Path(__file__).parent), path=str(path))
    env = {**os.environ, KILL_ENV: f"3:{phase}"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr[-2000:]
    # the same bars booked without a kill, up to the last committed one
    reference = opened(tmp_path / "reference.sqlite")
    account, risk, fills = book(reference, [bar(i, 4800.0 + i, 4800.25 + i) for i in range(stored)], [1, 1, -1, 0, 1, 1])
    crashed = opened(path)
    loaded = crashed.load(ES.multiplier)
    assert len(loaded.bars) == stored and loaded.fills == fills
    assert loaded.accounts["ES.FUT"] == account and loaded.risk == risk
    assert crashed.fills_rows() == reference.fills_rows()
    crashed.close()
    reference.close()


def test_an_event_between_bars_keeps_its_order_for_the_restart(tmp_path):
    path = tmp_path / "paper.sqlite"
    ledger = opened(path)
    account, risk, _ = book(ledger, [bar(0, 4800.0, 4800.0), bar(1, 4800.0, 4801.0)], [1, 1])
    assert account.position == 1 and account.pending is None
    flat = Order("ES.FUT", ts(2), 0, -1, "stale feed", account.mark)
    account.pending = flat
    ledger.record_event(ts(9), "ES.FUT", "stale", "stale feed: ...", account, risk, flat)
    ledger.close()
    again = opened(path)
    loaded = again.load(ES.multiplier)
    assert loaded.accounts["ES.FUT"].pending == flat
    assert loaded.events == [(ts(9), "ES.FUT", "stale", "stale feed: ...")]
    # the restored order fills on the next bar and is marked filled
    model = FillModel(ES, 2.25, 1.0, "next_open")
    restored = loaded.accounts["ES.FUT"]
    fills = model.on_bar(restored, bar(2, 4801.0, 4801.5))
    again.record_bar(bar(2, 4801.0, 4801.5), restored, fills, None, loaded.risk, [], 0, 0, 0)
    assert again.conn.execute("SELECT reason, filled_ts_ns FROM orders ORDER BY id DESC LIMIT 1").fetchone() == (
        "stale feed",
        ts(2),
    )
    assert restored.position == 0 and again.load(ES.multiplier).accounts["ES.FUT"].pending is None
    again.close()


def test_another_sessions_ledger_is_refused_in_one_line(tmp_path):
    path = tmp_path / "paper.sqlite"
    opened(path).close()
    again = opened(path)
    assert again.existing and again.meta() == {"format": "4", **{k: str(v) for k, v in IDENTITY.items()}}
    again.close()
    line = refused(lambda: Ledger(path, {**IDENTITY, "fill_price": "decision_close"}).open(), unchanged=path)
    assert line == (f"ledger error: paper.ledger={path}: made with fill_price=next_open, this session has "
                    "fill_price=decision_close; use another paper.ledger to start afresh")  # fmt: skip
    old = tmp_path / "old.sqlite"  # a ledger of the format before this one (no format key, tables not STRICT)
    conn = sqlite3.connect(old)
    conn.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);")
    conn.close()
    refused(lambda: Ledger(old, IDENTITY).open(), "not a paper ledger of this foxhunt", unchanged=old)


def test_priming_bars_are_stored_untraded_and_loaded_in_order(tmp_path):
    ledger = opened(tmp_path / "paper.sqlite")
    priming = [bar(i, 4800.0, 4800.0 + i * 0.25, roll=4790.0 if i == 1 else math.nan) for i in range(3)]
    ledger.record_priming(priming)
    book(ledger, [bar(3, 4801.0, 4801.0)], [1])
    loaded = ledger.load(ES.multiplier)
    assert [(row[1], row[7]) for row in loaded.bars] == [(b.ts_ns, 0) for b in priming] + [(ts(3), 1)]
    assert [r[0] for r in ledger.equity_rows()] == [ts(3)]  # only traded bars in the equity curve
    assert ledger.conn.execute("SELECT roll_price FROM bars ORDER BY seq").fetchall() == [(None,), (4790.0,), (None,), (None,)]
    ledger.close()


# -- one session's ledger: identity, lock, faults of the file ---------------------------------
def test_a_ledger_of_another_rule_or_data_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    path = tmp_path / "paper.sqlite"
    made = {**IDENTITY, "rule": "majority", "data": "sha256:aaaa"}
    opened(path, made).close()
    for key, value in (("rule", "mean_forecast"), ("data", "sha256:bbbb"), ("capital_usd", 1.0)):
        line = refused(lambda: Ledger(path, {**made, key: value}).open(), f"paper.ledger={path}", f"made with {key}=",
                       f"this session has {key}={value}", unchanged=path)  # fmt: skip
        assert "use another paper.ledger" in line
    opened(path, made).close()  # the same identity opens


def _holder_script(path: Path) -> str:
    return textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_ledger import IDENTITY, opened
        ledger = opened(Path({str(path)!r}))
        print("held", flush=True)
        sys.stdin.readline()
    """)


def test_a_ledger_held_by_another_process_is_refused_naming_it_and_a_dead_holder_blocks_nothing(tmp_path):
    """The lock is the kernel's (flock on the ledger file): it names its holder while that lives,
    and goes with it when it dies, kill -9 included: no stale lock to clear by hand."""
    import socket

    path = tmp_path / "paper.sqlite"
    opened(path).close()
    holder = subprocess.Popen([sys.executable, "-c", _holder_script(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        line = refused(lambda: Ledger(path, IDENTITY).open(), f"paper.ledger={path}", "in use by another paper session",
                       f"pid {holder.pid} on {socket.gethostname()} since ", unchanged=path)  # fmt: skip
        assert "one ledger is one session's" in line
    finally:
        holder.kill()  # SIGKILL: no clean-up of any kind
        holder.wait(timeout=30)
    opened(path).close()


def test_a_second_session_in_the_same_process_is_refused_and_the_first_goes_on(tmp_path):
    path = tmp_path / "paper.sqlite"
    first = opened(path)
    book(first, [bar(0, 4800.0, 4800.25)], [1])
    refused(lambda: Ledger(path, IDENTITY).open(), "in use by another paper session", f"pid {os.getpid()} on ")
    book(first, [bar(1, 4800.0, 4800.25)], [1])  # the first session's locks are intact: it writes on
    first.close()
    again = opened(path)
    assert len(again.load(ES.multiplier).bars) == 2
    again.close()


def test_a_damaged_or_foreign_file_is_one_line_and_left_as_it_was(tmp_path):
    path = tmp_path / "paper.sqlite"
    ledger = opened(path)
    book(ledger, [bar(i, 4800.0 + i, 4800.25 + i) for i in range(200)], [1, -1] * 100)
    ledger.close()
    size = path.stat().st_size
    raw = bytearray(path.read_bytes())
    raw[size // 2 : size // 2 + 4096] = b"\xa5" * 4096  # a page in the middle of the bars
    path.write_bytes(bytes(raw))
    refused(lambda: Ledger(path, IDENTITY).open(), f"paper.ledger={path}", "damaged", unchanged=path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    refused(lambda: Ledger(junk, IDENTITY).open(), "junk.sqlite", "not a paper ledger", unchanged=junk)
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.executescript("CREATE TABLE meta (key TEXT, value TEXT); CREATE TABLE bars (seq INTEGER);")
    conn.close()
    refused(lambda: Ledger(other, IDENTITY).open(), "other.sqlite", "not a paper ledger", unchanged=other)


def test_a_ledger_that_is_a_link_a_folder_or_under_a_file_is_one_line(tmp_path):
    real = tmp_path / "real.sqlite"
    opened(real).close()
    link = tmp_path / "link.sqlite"
    link.symlink_to(real)
    refused(lambda: Ledger(link, IDENTITY).open(), f"paper.ledger={link}", "symbolic link", unchanged=real)
    dangling = tmp_path / "dangling.sqlite"
    dangling.symlink_to(tmp_path / "elsewhere.sqlite")
    refused(lambda: Ledger(dangling, IDENTITY).open(), "symbolic link")
    assert not (tmp_path / "elsewhere.sqlite").exists()  # nothing made through the link
    second = tmp_path / "second-name.sqlite"
    os.link(real, second)  # a second name of the same file would be a second lock
    refused(lambda: Ledger(second, IDENTITY).open(), f"paper.ledger={second}", "2 names", unchanged=real)
    folder = tmp_path / "folder.sqlite"
    folder.mkdir()
    refused(lambda: Ledger(folder, IDENTITY).open(), f"paper.ledger={folder}", "a folder")
    afile = tmp_path / "afile"
    afile.write_text("x")
    refused(lambda: Ledger(afile / "paper.sqlite", IDENTITY).open(), f"paper.ledger={afile / 'paper.sqlite'}", "not a folder")
    refused(lambda: Ledger(afile / "sub" / "paper.sqlite", IDENTITY).open(), "not a folder")
    wal = tmp_path / "wal.sqlite"
    opened(wal).close()
    (tmp_path / "wal.sqlite-wal").symlink_to(tmp_path / "victim")
    refused(lambda: Ledger(wal, IDENTITY).open(), "wal.sqlite-wal", "symbolic link", unchanged=wal)
    assert not (tmp_path / "victim").exists()


READ_ONLY = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from paper_bars import refused
    from test_ledger import IDENTITY
    from foxhunt.paper.ledger import Ledger
    print(refused(lambda: Ledger(Path({path!r}), IDENTITY).open(), {path!r}, "cannot be written", unchanged=Path({path!r})))
""")


def _without_root_overrides() -> None:
    """In the child before its exec: root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped
    from the bounding set), so that file modes bind it as any user."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_ledger_is_one_line_and_left_as_it_was(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "paper.sqlite"
    opened(path).close()
    path.chmod(0o444)
    folder.chmod(0o555)  # nor may its -wal and -shm files be made
    try:
        script = READ_ONLY.format(tests=str(Path(__file__).parent), path=str(path))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              preexec_fn=_without_root_overrides if os.geteuid() == 0 else None)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "cannot be written" in done.stdout
    finally:
        folder.chmod(0o755)


def test_a_ledger_killed_while_it_was_made_opens_as_a_new_one(tmp_path):
    for name, make in (("empty.sqlite", lambda p: p.write_bytes(b"")),
                       ("wal-only.sqlite", lambda p: sqlite3.connect(p).execute("PRAGMA journal_mode=WAL").fetchall())):  # fmt: skip
        path = tmp_path / name
        make(path)
        ledger = opened(path)
        assert not ledger.existing and ledger.meta()["format"] == "4"
        ledger.close()
        again = opened(path)
        assert again.existing
        again.close()


def test_a_ledger_moved_under_a_running_session_is_one_line_at_its_next_write(tmp_path):
    path = tmp_path / "paper.sqlite"
    ledger = opened(path)
    book(ledger, [bar(0, 4800.0, 4800.25)], [1])
    ledger.close()
    again = opened(path)  # read-only until its first write
    path.rename(tmp_path / "moved.sqlite")
    path.write_bytes(b"")
    refused(lambda: book(again, [bar(1, 4800.0, 4800.25)], [1]), f"paper.ledger={path}", "moved or replaced")
    again.close()
