"""The ledger of a paper session: every bar read, order, fill, position, the cash and the risk
state, in one SQLite file, one transaction per bar; one session's, and trusted only once its
content has been recomputed.

Each bar is one transaction (:meth:`Ledger.record_bar`): the bar itself (the loop replays the
stored bars through the ensemble on a restart, so a live feed's history is here too), the member
versions that decided it (``bars.versions``: ``name:version:weights`` of each member; a hot swap
to a promoted version shows as the first bar of the new version, with a ``swap`` event), the
fills made on it, the order decided at its close, each symbol's position, cash and mark, the
risk state and the events (a breach, a stale feed, a swap). Killed at any moment (kill -9), the file holds
every bar up to the last committed one and nothing of the next, and the feed goes on after the
last bar stored, so no fill is lost or doubled.

A ledger is one session's:

* the lock: :meth:`Ledger.open` takes an exclusive ``flock`` on the file itself
  (:mod:`foxhunt.paper.lock`), held until :meth:`Ledger.close`; a second session is refused in
  one line naming the holder (pid, host, start). The kernel drops the lock with its process, so
  a killed session leaves none behind;
* the identity: the ``meta`` table holds what decides or prices a fill (the session's
  ``identity``: the members' registered names, rule, costs, capital, limits, the feed and the
  digest of its data, the format of these tables), and each traded bar the versions and weights
  that decided it; a ledger of any other identity is refused;
* the content: on a restart the session replays the stored bars (or the feed's own bars) into
  a scratch ledger in memory (:meth:`Ledger.scratch`), each decided by the versions stored with
  it (loaded and verified as at start; a swap where they change), and every row of every table
  but the timings must equal what was replayed (:meth:`Ledger.compare`): an account, a fill, an
  order, a decision, a version, a bar or a risk state that was edited, added or deleted is
  refused in one line.

Every fault of the file (not a ledger, damaged pages, other tables, a symbolic link, a folder,
a second name, a read-only file or folder, a parent that is a file) is one line
(:class:`LedgerError`), and nothing is written before the checks have passed: an existing
ledger is read through a read-only connection until its first new bar, so a refused ledger is
left byte for byte as it was.

SQLite in WAL mode, STRICT tables: ``paper.ledger_sync=normal`` commits survive the process
being killed (the WAL is in the OS's page cache) but the last ones may be lost on a power cut;
``full`` fsyncs every commit. Written by hand on the standard library's ``sqlite3``: a few tables
and one transaction per bar need no ORM.

``FOXHUNT_PAPER_KILL_AT=<bar>:<before_commit|after_commit>`` makes the process kill itself
(SIGKILL) at that bar's transaction: how the crash tests hit a chosen moment exactly.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import signal
import sqlite3
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np

from foxhunt.errors import UserError
from foxhunt.paper.feeds import FeedBar
from foxhunt.paper.fills import Account, Fill, Order
from foxhunt.paper.lock import FileLock, Held
from foxhunt.paper.risk import RiskState

KILL_ENV = "FOXHUNT_PAPER_KILL_AT"
FORMAT = "4"  # the layout and booking of the tables below, kept in meta as `format`; 2: STRICT tables, events.after_seq;
#  3: bars.versions; 4: a stale flat placed at a bar references the last close, its fill books the gap from it (a
#  ledger of 3 with a stale flat would replay as edited: refused by its format instead)
SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's files beside the ledger
AGAIN = "use another paper.ledger to start afresh"
SWAP_WARM_KEY = "roll.swap.warm_bars"  # the identity's key of the bars a swapped-in member warms on
ADDED_IDENTITY = (SWAP_WARM_KEY,)  # identity keys a ledger of this format written before them lacks
MAX_TIME_NS = 7_258_118_400_000_000_000  # 2200-01-01 UTC: the latest time a ledger holds (pandas ends in 2262)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS bars (
  seq INTEGER PRIMARY KEY, symbol TEXT NOT NULL, ts_ns INTEGER NOT NULL, open REAL, high REAL, low REAL, close REAL,
  volume REAL, raw_open REAL, raw_close REAL, roll_price REAL, trade INTEGER NOT NULL, contract TEXT,
  target INTEGER, versions TEXT, position INTEGER NOT NULL, cash REAL NOT NULL, equity REAL NOT NULL, fleet_ns INTEGER,
  loop_ns INTEGER, UNIQUE (symbol, ts_ns)) STRICT;
CREATE TABLE IF NOT EXISTS orders (
  id INTEGER PRIMARY KEY, symbol TEXT NOT NULL, ts_ns INTEGER NOT NULL, target INTEGER NOT NULL, quantity INTEGER NOT NULL,
  reason TEXT NOT NULL, reference REAL NOT NULL, filled_ts_ns INTEGER) STRICT;
CREATE TABLE IF NOT EXISTS fills (
  id INTEGER PRIMARY KEY, order_id INTEGER, symbol TEXT NOT NULL, ts_ns INTEGER NOT NULL, quantity INTEGER NOT NULL,
  price REAL NOT NULL, commission REAL NOT NULL, kind TEXT NOT NULL, reference REAL NOT NULL, gap_usd REAL NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS accounts (
  symbol TEXT PRIMARY KEY, position INTEGER NOT NULL, cash REAL NOT NULL, mark REAL, pending_order INTEGER) STRICT;
CREATE TABLE IF NOT EXISTS risk (
  id INTEGER PRIMARY KEY CHECK (id = 1), day TEXT, day_start REAL, peak REAL, status TEXT, reason TEXT) STRICT;
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY, ts_ns INTEGER, symbol TEXT, kind TEXT NOT NULL, message TEXT NOT NULL, after_seq INTEGER) STRICT;
"""
# events.after_seq: NULL for an event of a bar's transaction; for one between bars (a live feed's
# heartbeat) the count of bars stored then, which is where a resume replays it
# bars.versions: the members that decided a traded bar, "name:version:weights" joined by ","; NULL on a priming bar
# bars.fleet_ns, bars.loop_ns: the ensemble's step and the loop's own time on a traded bar (ns; not compared on a resume).
# fleet_ns is named after "fleet", the ensemble's earlier name: an existing ledger is checked against this text, so
# renaming the column would refuse every ledger written before (a session could no longer resume)

# what a resume compares with its replay (every column but the timings), each table in its order
COMPARED = {
    "bars": ("seq", ("seq", "symbol", "ts_ns", "open", "high", "low", "close", "volume", "raw_open", "raw_close", "roll_price",
                     "trade", "contract", "target", "versions", "position", "cash", "equity")),
    "orders": ("id", ("id", "symbol", "ts_ns", "target", "quantity", "reason", "reference", "filled_ts_ns")),
    "fills": ("id", ("id", "order_id", "symbol", "ts_ns", "quantity", "price", "commission", "kind", "reference", "gap_usd")),
    "events": ("id", ("id", "ts_ns", "symbol", "kind", "message", "after_seq")),
    "accounts": ("symbol", ("symbol", "position", "cash", "mark", "pending_order")),
    "risk": ("id", ("id", "day", "day_start", "peak", "status", "reason")),
}  # fmt: skip
BAR_COLUMNS = (
    "symbol",
    "ts_ns",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "raw_open",
    "raw_close",
    "roll_price",
    "trade",
    "contract",
)


class LedgerError(UserError):
    """A paper ledger that cannot be used as it is (a fault of the file, another session's, held
    by a running session, edited): one line naming the file; nothing was written."""

    kind = "ledger"


@dataclass
class Loaded:
    """A ledger's state: each symbol's account (its pending order included), the risk state,
    the bars stored (for the ensemble's state) and the count of fills."""

    accounts: dict[str, Account]
    risk: RiskState
    bars: list[tuple]  # (symbol, ts_ns, open, high, low, close, volume, trade, target)
    fills: int
    events: list[tuple] = field(default_factory=list)


class Ledger:
    """One session's ledger at ``path`` (module doc); ``identity``: what the session's fills
    depend on, as text (the ``meta`` table)."""

    def __init__(self, path: Path, identity: dict[str, str], sync: str = "normal") -> None:
        self.path = Path(path)
        self.identity = {"format": FORMAT, **{k: str(v) for k, v in identity.items()}}
        self.sync = sync
        self.conn: sqlite3.Connection | None = None
        self.existing = False  # opened on bars stored before (a resume)
        self._lock: FileLock | None = None
        self._inode: tuple[int, int] | None = None
        self._writing = False  # the connection is read-write (after the first write)
        self._order_ids: dict[str, int] = {}
        self._bars = 0
        kill = os.environ.get(KILL_ENV)
        self._kill = None if not kill else (int(kill.split(":")[0]), kill.split(":")[1])

    @property
    def where(self) -> str:
        return f"paper.ledger={self.path}"

    @property
    def _db(self) -> sqlite3.Connection:
        """The open connection (RuntimeError when the ledger is not open: a bug of its caller)."""
        if self.conn is None:
            raise RuntimeError(f"{self.where}: the ledger is not open")
        return self.conn

    @classmethod
    def scratch(cls, identity: dict[str, str]) -> Ledger:
        """A ledger in memory: where a resume replays the stored bars (never killed, never locked)."""
        ledger = cls(Path(":memory:"), identity)
        ledger._kill = None
        ledger.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        ledger.conn.executescript(SCHEMA)
        ledger._writing = True
        return ledger

    # -- opening ---------------------------------------------------------------------------
    def open(self) -> None:
        """Take the ledger for this session: the place checked, the lock taken, an existing
        ledger's pages, tables and identity checked through a read-only connection (it is
        written from its first new bar on), a new one made. Every refusal a LedgerError."""
        self._check_place()
        self._take()
        try:
            self._same_file()
            self.conn = sqlite3.connect(f"file:{quote(str(self.path.absolute()))}?mode=ro", uri=True,
                                        isolation_level=None, check_same_thread=False)  # fmt: skip
            self.existing = self.conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] > 0
            if self.existing:
                self._check_contents()
                self._bars = self.conn.execute("SELECT COUNT(*) FROM bars").fetchone()[0]
            else:  # new: an empty file, or a database of no table (killed while it was being made)
                self._start_writing(new=True)
        except sqlite3.DatabaseError as exc:
            self.close()
            raise LedgerError(f"{self.where}: not a paper ledger, or a damaged one (SQLite: {exc}); nothing was written: "
                              f"restore it from a copy, or {AGAIN}") from None  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _check_place(self) -> None:
        """The file's place: its folder a folder, the file (and SQLite's files beside it) a
        plain file of one name when there, not a link, not read-only."""
        folder = self.path.parent
        for part in [*reversed(folder.parents), folder]:
            if part.exists() and not part.is_dir():
                raise LedgerError(f"{self.where}: {part} is not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"{self.where}: cannot make its folder {folder} ({exc.strerror or exc})") from None
        for suffix in ("", *SIDE_FILES):
            file = self.path.with_name(self.path.name + suffix)
            name = self.where + (f": its SQLite file {file.name}" if suffix else "")
            try:
                st = os.stat(file, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise LedgerError(f"{name} is a symbolic link (to {os.readlink(file)}); name the ledger file itself")
            if stat.S_ISDIR(st.st_mode):
                raise LedgerError(f"{name} is a folder, not a ledger file")
            if not stat.S_ISREG(st.st_mode):
                raise LedgerError(f"{name} is not a regular file")
        file_ro = self.path.exists() and not os.access(self.path, os.W_OK)
        if file_ro or not os.access(folder, os.W_OK | os.X_OK):
            what = "the file" if file_ro else f"its folder {folder}"
            raise LedgerError(f"{self.where}: cannot be written ({what} is read-only to this user; SQLite also writes its "
                              "-wal and -shm files beside it); nothing was written")  # fmt: skip

    def _take(self) -> None:
        lock = FileLock(self.path)
        try:
            st = lock.take()
        except Held as held:
            raise LedgerError(f"{self.where}: in use by another paper session ({held.holder}); one ledger is one session's: "
                              f"stop that one, or {AGAIN}") from None  # fmt: skip
        except OSError as exc:
            reasons: dict[int | None, str] = {errno.ELOOP: "is a symbolic link; name the ledger file itself", errno.EISDIR: "is a folder, not a ledger file",
                   errno.EACCES: "cannot be written (read-only to this user)", errno.EPERM: "cannot be written (not permitted)",
                   errno.EROFS: "cannot be written (a read-only file system)"}  # fmt: skip
            why = reasons.get(exc.errno, f"cannot be opened ({exc.strerror})")
            raise LedgerError(f"{self.where}: {why}") from None
        self._lock = lock
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            self.close()
            what = "is not a regular file" if not stat.S_ISREG(st.st_mode) else (
                f"has {st.st_nlink} names (hard links): a ledger has one, so that no second name takes a second lock")  # fmt: skip
            raise LedgerError(f"{self.where}: {what}")
        self._inode = (st.st_dev, st.st_ino)

    def _check_contents(self) -> None:
        """An existing ledger, read only: its pages whole, its tables foxhunt's, its identity this session's."""
        problems = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
            raise LedgerError(f"{self.where}: a damaged paper ledger ({problems[0]}{more}); nothing was written: restore it "
                              f"from a copy, or {AGAIN}")  # fmt: skip
        tables = set(self._db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
        if tables != _schema_rows():
            differ = sorted({row[1] for row in tables ^ _schema_rows()})
            raise LedgerError(f"{self.where}: not a paper ledger of this foxhunt (against format {FORMAT}, these differ: "
                              f"{', '.join(differ)}); {AGAIN}")  # fmt: skip
        stored = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        if stored.get("format") != FORMAT:
            raise LedgerError(f"{self.where}: a ledger of format {stored.get('format', '(none)')}, this foxhunt keeps format "
                              f"{FORMAT}; {AGAIN}")  # fmt: skip
        for key in [*self.identity, *sorted(set(stored) - set(self.identity))]:
            if key in ADDED_IDENTITY and key not in stored:  # a ledger written before the key: resumed as before
                continue
            if stored.get(key) != self.identity.get(key):
                raise LedgerError(f"{self.where}: made with {key}={stored.get(key, '(nothing)')}, this session has "
                                  f"{key}={self.identity.get(key, '(nothing)')}; {AGAIN}")  # fmt: skip

    def _start_writing(self, new: bool = False) -> None:
        """From the first write on: the read-write connection (on the file locked), WAL, the
        tables and the identity of a new ledger."""
        if self._writing:
            return
        if self.conn is not None:
            self.conn.close()
        self._same_file()
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={'FULL' if self.sync == 'full' else 'NORMAL'}")
        if new:  # the tables and the identity in one transaction: killed in between, the file stays empty
            self.conn.executescript("BEGIN IMMEDIATE;" + SCHEMA)
            try:
                self.conn.executemany("INSERT INTO meta VALUES (?, ?)", list(self.identity.items()))
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")
        self._writing = True

    def _same_file(self) -> None:
        """The path still names the file locked (SQLite opens it by name)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._inode:
            raise LedgerError(f"{self.where}: the file was moved or replaced while this session held it; nothing was written")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- reading ---------------------------------------------------------------------------
    def load(self, multiplier: float) -> Loaded:
        """The state as stored (what a report shows; a resume replays the bars instead)."""
        c = self._db
        orders = {row[0]: row for row in c.execute(
            "SELECT id, symbol, ts_ns, target, quantity, reason, reference FROM orders WHERE filled_ts_ns IS NULL")}  # fmt: skip
        accounts = {}
        for symbol, position, cash, mark, pending in c.execute(
            "SELECT symbol, position, cash, mark, pending_order FROM accounts"
        ):
            order = None
            if pending in orders:
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

    def stored_bars(self) -> list[FeedBar]:
        """The bars stored, in their order, as the feed gave them (a value of a wrong kind: one line)."""
        bars = []
        for seq, row in enumerate(self._db.execute(f"SELECT {', '.join(BAR_COLUMNS)} FROM bars ORDER BY seq"), 1):
            values = dict(zip(BAR_COLUMNS, row))
            for name, value in values.items():
                nullable = name in ("roll_price", "contract")
                kind = str if name in ("symbol", "contract") else int if name in ("ts_ns", "trade") else float
                if (value is None and not nullable) or (value is not None and not isinstance(value, kind)) or (
                        isinstance(value, float) and not math.isfinite(value)):  # fmt: skip
                    raise LedgerError(f"{self.where}: bars {seq}: {name} is {value!r}, not a {kind.__name__}; the ledger was "
                                      f"edited: nothing was written ({AGAIN})")  # fmt: skip
            values["roll_price"] = math.nan if values["roll_price"] is None else values["roll_price"]
            values["trade"] = bool(values["trade"])
            values["contract"] = values["contract"] or ""
            bars.append(FeedBar(**values))
        return bars

    def stored_versions(self) -> list[str | None]:
        """The versions that decided each stored bar, in their order (None: a priming bar)."""
        found = []
        for seq, (versions,) in enumerate(self._db.execute("SELECT versions FROM bars ORDER BY seq"), 1):
            if versions is not None and not isinstance(versions, str):
                raise LedgerError(f"{self.where}: bars {seq}: versions is {versions!r}, not the members that decided it; the "
                                  f"ledger was edited: nothing was written ({AGAIN})")  # fmt: skip
            found.append(versions)
        return found

    def between_events(self) -> dict[int, list[int]]:
        """The times of the events written between bars (heartbeats), by the count of bars stored then."""
        beats: dict[int, list[int]] = {}
        for after, ts in self._db.execute("SELECT after_seq, ts_ns FROM events WHERE after_seq IS NOT NULL ORDER BY id"):
            if not isinstance(ts, int) or not 0 <= ts <= MAX_TIME_NS:
                raise LedgerError(
                    f"{self.where}: events: an event between bars at {ts!r}, not a time; nothing was written ({AGAIN})"
                )
            times = beats.setdefault(after, [])
            if not times or times[-1] != ts:  # one heartbeat writes an event per stale symbol
                times.append(ts)
        return beats

    def compare(self, replayed: Ledger) -> None:
        """Every row of every table (but the timings) equal to ``replayed``'s, else a LedgerError
        naming the first difference."""
        for table, (key, columns) in COMPARED.items():
            query = f"SELECT {', '.join(columns)} FROM {table} ORDER BY {key}"
            have, want = self._db.execute(query).fetchall(), replayed._db.execute(query).fetchall()
            for stored, booked in zip(have, want):
                for column, a, b in zip(columns, stored, booked):
                    if type(a) is not type(b) or a != b:
                        row = " ".join(filter(None, (table, _row_name(table, stored))))
                        raise LedgerError(f"{self.where}: {row}: {column} is {a!r} in the ledger, "
                                          f"replaying its bars books {b!r}; the ledger was edited or is another session's: "
                                          f"nothing was written ({AGAIN})")  # fmt: skip
            if len(have) != len(want):
                raise LedgerError(f"{self.where}: {table}: {len(have)} rows in the ledger, replaying its bars books {len(want)}; "
                                  f"the ledger was edited or is another session's: nothing was written ({AGAIN})")  # fmt: skip

    def adopt(self, replayed: Ledger) -> None:
        """Go on from where the replay ended (it equals the ledger: :meth:`compare`)."""
        self._order_ids = dict(replayed._order_ids)
        self._bars = replayed._bars

    # -- writing ---------------------------------------------------------------------------
    def record_bar(self, bar, account: Account, fills: list[Fill], order: Order | None, risk: RiskState,
                   events: list[tuple[str, str]], target: int | None, ensemble_ns: int, loop_ns: int,
                   stale_order: Order | None = None, replaced: bool = False, versions: str = "") -> None:  # fmt: skip
        """One bar's transaction (module doc). ``stale_order``: the flat a stale gap placed at this
        bar's open, filled by this bar (its own order row, which its fill names); ``replaced``: the
        pending order was dropped at this bar's open (its row stays unfilled); ``versions``: the
        members that decided it."""
        with self._writes(f"the bar at {_when(bar.ts_ns)}"):
            self._record_bar(
                bar, account, fills, order, risk, events, target, ensemble_ns, loop_ns, stale_order, replaced, versions
            )
        self._maybe_kill("after_commit")

    def _record_bar(self, bar, account, fills, order, risk, events, target, ensemble_ns, loop_ns, stale_order, replaced,
                    versions) -> None:  # fmt: skip
        c = self._db
        self._bars += 1
        try:
            self._bar_transaction(c, bar, account, fills, order, risk, events, target, ensemble_ns, loop_ns, stale_order, replaced,
                                  versions)  # fmt: skip
        except BaseException:
            self._bars -= 1
            raise

    def _bar_transaction(self, c, bar, account, fills, order, risk, events, target, ensemble_ns, loop_ns, stale_order, replaced,
                         versions) -> None:  # fmt: skip
        with self._transaction():
            c.execute("INSERT INTO bars (symbol, ts_ns, open, high, low, close, volume, raw_open, raw_close, roll_price, trade, "
                      "contract, target, versions, position, cash, equity, fleet_ns, loop_ns) "
                      "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      (bar.symbol, bar.ts_ns, bar.open, bar.high, bar.low, bar.close, bar.volume, bar.raw_open, bar.raw_close,
                       None if math.isnan(bar.roll_price) else bar.roll_price, int(bar.trade), bar.contract, target, versions,
                       account.position, account.cash, account.equity, ensemble_ns, loop_ns))  # fmt: skip
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
                c.executemany(
                    "INSERT INTO events (ts_ns, symbol, kind, message) VALUES (?,?,?,?)",
                    [(bar.ts_ns, bar.symbol, kind, message) for kind, message in events],
                )
            self._maybe_kill("before_commit")

    def _insert_order(self, order: Order) -> int:
        cur = self._db.execute(
            "INSERT INTO orders (symbol, ts_ns, target, quantity, reason, reference) VALUES (?,?,?,?,?,?)",
            (order.symbol, order.ts_ns, order.target, order.quantity, order.reason, order.reference),
        )
        assert cur.lastrowid is not None  # set by the INSERT
        return cur.lastrowid

    def record_priming(self, bars: list) -> None:
        """Bars that only prime the features, in one transaction (killed before it, a file
        feed primes them again)."""
        with self._writes(f"the {len(bars)} priming bars"), self._transaction():
            self._db.executemany(
                "INSERT INTO bars (symbol, ts_ns, open, high, low, close, volume, raw_open, raw_close, roll_price, trade, contract, "
                "position, cash, equity) VALUES (?,?,?,?,?,?,?,?,?,?,0,?,0,0,0)",
                [(b.symbol, b.ts_ns, b.open, b.high, b.low, b.close, b.volume, b.raw_open, b.raw_close,
                  None if math.isnan(b.roll_price) else b.roll_price, b.contract) for b in bars])  # fmt: skip
        self._bars += len(bars)

    def record_event(self, ts_ns: int, symbol: str, kind: str, message: str, account: Account | None = None,
                     risk: RiskState | None = None, order: Order | None = None) -> None:  # fmt: skip
        """An event between bars (a stale live feed), with the order it placed, in one transaction;
        it keeps the count of bars stored before it (where a resume replays it)."""
        with self._writes(f"the event at {_when(ts_ns)}"), self._transaction():
            self._db.execute(
                "INSERT INTO events (ts_ns, symbol, kind, message, after_seq) VALUES (?,?,?,?,?)",
                (ts_ns, symbol, kind, message, self._bars),
            )
            if order is not None and account is not None:
                self._order_ids.pop(account.symbol, None)
                self._order_ids[account.symbol] = self._insert_order(order)
            if account is not None and risk is not None:
                self._write_state(account, risk)

    def _write_state(self, account: Account, risk: RiskState) -> None:
        self._db.execute("INSERT OR REPLACE INTO accounts VALUES (?,?,?,?,?)",
                          (account.symbol, account.position, account.cash, None if math.isnan(account.mark) else account.mark,
                           self._order_ids.get(account.symbol) if account.pending is not None else None))  # fmt: skip
        self._db.execute(
            "INSERT OR REPLACE INTO risk VALUES (1,?,?,?,?,?)", (risk.day, risk.day_start, risk.peak, risk.status, risk.reason)
        )

    @contextmanager
    def _writes(self, what: str):
        """Around a write: the read-write connection (from the first write on); SQLite unable to
        write (a full disk, a read-only file, an I/O error, a damaged page) is one line, and the
        transaction is rolled back: every bar before it stays. A broken constraint is a bug."""
        try:
            self._start_writing()
            yield
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError)):
                raise
            raise LedgerError(f"{self.where}: cannot write {what} (SQLite: {exc}); every bar before it is kept") from None

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
        return self._db.execute("SELECT id, order_id, symbol, ts_ns, quantity, price, commission, kind, reference, gap_usd "
                                 "FROM fills ORDER BY id").fetchall()  # fmt: skip

    def equity_rows(self) -> list[tuple]:
        return self._db.execute(
            "SELECT ts_ns, position, equity, target, fleet_ns, loop_ns FROM bars WHERE trade = 1 ORDER BY seq"
        ).fetchall()

    def version_changes(self) -> list[tuple[int, int, str]]:
        """(seq, ts_ns, versions) of each traded bar decided by other versions than the traded bar before it
        (the first traded bar included): where the session started and where it swapped."""
        changes, last = [], None
        for seq, ts, versions in self._db.execute("SELECT seq, ts_ns, versions FROM bars WHERE trade = 1 ORDER BY seq"):
            if versions != last:
                changes.append((seq, ts, versions))
                last = versions
        return changes

    def meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())


def _when(ts_ns: int) -> str:
    return str(np.datetime64(int(ts_ns), "ns").astype("datetime64[s]"))


def _row_name(table: str, row: tuple) -> str:
    """How a difference names its row: a bar by its seq and time, an account by its symbol, an
    order, a fill or an event by its id (the risk state is one row)."""
    if table == "bars":
        return f"{row[0]} ({_when(row[2]) if isinstance(row[2], int) else repr(row[2])})"
    return "" if table == "risk" else str(row[0])


@functools.cache
def _schema_rows() -> frozenset[tuple]:
    """``sqlite_master`` of a ledger of this format: its tables, their indexes and nothing else."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SCHEMA)
        return frozenset(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
    finally:
        conn.close()
