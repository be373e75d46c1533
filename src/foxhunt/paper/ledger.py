"""The ledger of a paper session: every bar read, order, fill, position, the cash and the risk
state, in one SQLite file, one transaction per bar.

Each bar is one transaction (:meth:`Ledger.record_bar`): the bar itself (the loop replays the
stored bars through the fleet on a restart, so a live feed's history is here too), the fills
made on it, the order decided at its close, each symbol's position, cash and mark, the risk
state and the events (a breach, a stale feed). Killed at any moment (kill -9), the file holds
every bar up to the last committed one and nothing of the next: a restart
(:meth:`Ledger.load`) resumes the positions, the cash, the pending order and the risk state
exactly, and the feed goes on after the last bar stored, so no fill is lost or doubled.

SQLite in WAL mode: ``paper.ledger_sync=normal`` commits survive the process being killed
(the WAL is in the OS's page cache) but the last ones may be lost on a power cut; ``full``
fsyncs every commit. A ledger made by another fleet, asset, feed or fill setting is refused in
one line (:data:`IDENTITY_KEYS`). Written by hand on the standard library's ``sqlite3``: a few
tables and one transaction per bar need no ORM.

``FOXHUNT_PAPER_KILL_AT=<bar>:<before_commit|after_commit>`` makes the process kill itself
(SIGKILL) at that bar's transaction: how the crash tests hit a chosen moment exactly.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from foxhunt.errors import ConfigError
from foxhunt.paper.fills import Account, Fill, Order
from foxhunt.paper.risk import RiskState

KILL_ENV = "FOXHUNT_PAPER_KILL_AT"
IDENTITY_KEYS = ("asset", "members", "feed", "symbol", "fill_price", "commission_usd", "slippage_ticks", "capital_usd")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS bars (
  seq INTEGER PRIMARY KEY, symbol TEXT NOT NULL, ts_ns INTEGER NOT NULL, open REAL, high REAL, low REAL, close REAL,
  volume REAL, raw_open REAL, raw_close REAL, roll_price REAL, trade INTEGER NOT NULL, contract TEXT,
  target INTEGER, position INTEGER NOT NULL, cash REAL NOT NULL, equity REAL NOT NULL, fleet_ns INTEGER, loop_ns INTEGER,
  UNIQUE (symbol, ts_ns));
CREATE TABLE IF NOT EXISTS orders (
  id INTEGER PRIMARY KEY, symbol TEXT NOT NULL, ts_ns INTEGER NOT NULL, target INTEGER NOT NULL, quantity INTEGER NOT NULL,
  reason TEXT NOT NULL, reference REAL NOT NULL, filled_ts_ns INTEGER);
CREATE TABLE IF NOT EXISTS fills (
  id INTEGER PRIMARY KEY, order_id INTEGER, symbol TEXT NOT NULL, ts_ns INTEGER NOT NULL, quantity INTEGER NOT NULL,
  price REAL NOT NULL, commission REAL NOT NULL, kind TEXT NOT NULL, reference REAL NOT NULL, gap_usd REAL NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
  symbol TEXT PRIMARY KEY, position INTEGER NOT NULL, cash REAL NOT NULL, mark REAL, pending_order INTEGER);
CREATE TABLE IF NOT EXISTS risk (id INTEGER PRIMARY KEY CHECK (id = 1), day TEXT, day_start REAL, peak REAL, status TEXT, reason TEXT);
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, ts_ns INTEGER, symbol TEXT, kind TEXT NOT NULL, message TEXT NOT NULL);
"""


@dataclass
class Loaded:
    """A ledger's state: each symbol's account (its pending order included), the risk state,
    the bars stored (for the fleet's state) and the count of fills."""

    accounts: dict[str, Account]
    risk: RiskState
    bars: list[tuple]  # (symbol, ts_ns, open, high, low, close, volume, trade, target)
    fills: int
    events: list[tuple] = field(default_factory=list)


class Ledger:
    def __init__(self, path: Path, identity: dict[str, str], sync: str = "normal") -> None:
        self.path = Path(path)
        self.identity = {k: str(v) for k, v in identity.items()}
        self.sync = sync
        self.conn: sqlite3.Connection | None = None
        self._order_ids: dict[str, int] = {}
        self._bars = 0
        kill = os.environ.get(KILL_ENV)
        self._kill = None if not kill else (int(kill.split(":")[0]), kill.split(":")[1])

    # -- opening ---------------------------------------------------------------------------
    def check_existing(self) -> bool:
        """True when the file exists (and is this session's: else a one-line ConfigError);
        reads only."""
        if not self.path.exists():
            return False
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            try:
                stored = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"paper.ledger={self.path}: not a paper ledger ({exc})") from None
        for key in IDENTITY_KEYS:
            if key in self.identity and stored.get(key) != self.identity[key]:
                raise ConfigError(f"paper.ledger={self.path}: made with {key}={stored.get(key)}, this session has "
                                  f"{key}={self.identity[key]}; use another paper.ledger to start afresh")  # fmt: skip
        return True

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={'FULL' if self.sync == 'full' else 'NORMAL'}")
        self.conn.executescript(SCHEMA)
        with self._transaction():
            for key, value in self.identity.items():
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (key, value))
        self._bars = self.conn.execute("SELECT COUNT(*) FROM bars").fetchone()[0]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # -- reading ---------------------------------------------------------------------------
    def load(self, multiplier: float) -> Loaded:
        c = self.conn
        orders = {row[0]: row for row in c.execute(
            "SELECT id, symbol, ts_ns, target, quantity, reason, reference FROM orders WHERE filled_ts_ns IS NULL")}  # fmt: skip
        accounts = {}
        for symbol, position, cash, mark, pending in c.execute("SELECT symbol, position, cash, mark, pending_order FROM accounts"):
            order = None
            if pending is not None:
                _, sym, ts, target, qty, reason, ref = orders[pending]
                order = Order(sym, ts, target, qty, reason, ref)
                self._order_ids[symbol] = pending
            accounts[symbol] = Account(symbol, position, cash, math.nan if mark is None else mark, order, multiplier)
        row = c.execute("SELECT day, day_start, peak, status, reason FROM risk").fetchone()
        risk = RiskState(*row) if row else RiskState()
        bars = c.execute("SELECT symbol, ts_ns, open, high, low, close, volume, trade, target FROM bars ORDER BY seq").fetchall()
        fills = c.execute("SELECT COUNT(*) FROM fills").fetchone()[0]
        events = c.execute("SELECT ts_ns, symbol, kind, message FROM events ORDER BY id").fetchall()
        return Loaded(accounts, risk, bars, fills, events)

    # -- writing ---------------------------------------------------------------------------
    def record_bar(self, bar, account: Account, fills: list[Fill], order: Order | None, risk: RiskState,
                   events: list[tuple[str, str]], target: int | None, fleet_ns: int, loop_ns: int,
                   stale_order: Order | None = None, replaced: bool = False) -> None:  # fmt: skip
        """One bar's transaction (module doc). ``stale_order``: the flat a stale gap placed at this
        bar's open, filled by this bar (its own order row, which its fill names); ``replaced``: the
        pending order was dropped at this bar's open (its row stays unfilled)."""
        c = self.conn
        self._bars += 1
        with self._transaction():
            c.execute("INSERT INTO bars (symbol, ts_ns, open, high, low, close, volume, raw_open, raw_close, roll_price, trade, "
                      "contract, target, position, cash, equity, fleet_ns, loop_ns) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      (bar.symbol, bar.ts_ns, bar.open, bar.high, bar.low, bar.close, bar.volume, bar.raw_open, bar.raw_close,
                       None if math.isnan(bar.roll_price) else bar.roll_price, int(bar.trade), bar.contract, target,
                       account.position, account.cash, account.equity, fleet_ns, loop_ns))  # fmt: skip
            if replaced or stale_order is not None:
                self._order_ids.pop(account.symbol, None)
            if stale_order is not None:
                self._order_ids[account.symbol] = self._insert_order(stale_order)
            if fills:
                filled = self._order_ids.pop(account.symbol, None)
                if filled is not None:
                    c.execute("UPDATE orders SET filled_ts_ns = ? WHERE id = ?", (bar.ts_ns, filled))
                c.executemany("INSERT INTO fills (order_id, symbol, ts_ns, quantity, price, commission, kind, reference, gap_usd) "
                              "VALUES (?,?,?,?,?,?,?,?,?)",
                              [(filled if f.kind == "trade" else None, f.symbol, f.ts_ns, f.quantity, f.price, f.commission, f.kind,
                                f.reference, f.gap_usd) for f in fills])  # fmt: skip
            if order is not None:
                self._order_ids[account.symbol] = self._insert_order(order)
            self._write_state(account, risk)
            if events:
                c.executemany("INSERT INTO events (ts_ns, symbol, kind, message) VALUES (?,?,?,?)",
                              [(bar.ts_ns, bar.symbol, kind, message) for kind, message in events])
            self._maybe_kill("before_commit")
        self._maybe_kill("after_commit")

    def _insert_order(self, order: Order) -> int:
        cur = self.conn.execute("INSERT INTO orders (symbol, ts_ns, target, quantity, reason, reference) VALUES (?,?,?,?,?,?)",
                                (order.symbol, order.ts_ns, order.target, order.quantity, order.reason, order.reference))
        return cur.lastrowid

    def record_priming(self, bars: list) -> None:
        """Bars that only prime the features, in one transaction (killed before it, a file
        feed primes them again)."""
        with self._transaction():
            self.conn.executemany(
                "INSERT INTO bars (symbol, ts_ns, open, high, low, close, volume, raw_open, raw_close, roll_price, trade, contract, "
                "position, cash, equity) VALUES (?,?,?,?,?,?,?,?,?,?,0,?,0,0,0)",
                [(b.symbol, b.ts_ns, b.open, b.high, b.low, b.close, b.volume, b.raw_open, b.raw_close,
                  None if math.isnan(b.roll_price) else b.roll_price, b.contract) for b in bars])  # fmt: skip
        self._bars += len(bars)

    def record_event(self, ts_ns: int, symbol: str, kind: str, message: str, account: Account | None = None,
                     risk: RiskState | None = None, order: Order | None = None) -> None:  # fmt: skip
        """An event between bars (a stale live feed), with the order it placed, in one transaction."""
        with self._transaction():
            self.conn.execute("INSERT INTO events (ts_ns, symbol, kind, message) VALUES (?,?,?,?)", (ts_ns, symbol, kind, message))
            if order is not None and account is not None:
                self._order_ids.pop(account.symbol, None)
                self._order_ids[account.symbol] = self._insert_order(order)
            if account is not None and risk is not None:
                self._write_state(account, risk)

    def _write_state(self, account: Account, risk: RiskState) -> None:
        self.conn.execute("INSERT OR REPLACE INTO accounts VALUES (?,?,?,?,?)",
                          (account.symbol, account.position, account.cash, None if math.isnan(account.mark) else account.mark,
                           self._order_ids.get(account.symbol) if account.pending is not None else None))  # fmt: skip
        self.conn.execute("INSERT OR REPLACE INTO risk VALUES (1,?,?,?,?,?)", (risk.day, risk.day_start, risk.peak, risk.status, risk.reason))

    def _transaction(self):
        conn = self.conn

        class _Tx:
            def __enter__(self_inner):
                conn.execute("BEGIN IMMEDIATE")

            def __exit__(self_inner, exc_type, exc, tb):
                conn.execute("ROLLBACK" if exc_type else "COMMIT")
                return False

        return _Tx()

    def _maybe_kill(self, phase: str) -> None:
        if self._kill is not None and self._kill == (self._bars, phase):
            os.kill(os.getpid(), signal.SIGKILL)

    # -- reports ---------------------------------------------------------------------------
    def fills_rows(self) -> list[tuple]:
        return self.conn.execute("SELECT id, order_id, symbol, ts_ns, quantity, price, commission, kind, reference, gap_usd "
                                 "FROM fills ORDER BY id").fetchall()  # fmt: skip

    def equity_rows(self) -> list[tuple]:
        return self.conn.execute("SELECT ts_ns, position, equity, target, fleet_ns, loop_ns FROM bars WHERE trade = 1 ORDER BY seq").fetchall()

    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta").fetchall())


def identity_json(value) -> str:
    return json.dumps(value, sort_keys=True)
