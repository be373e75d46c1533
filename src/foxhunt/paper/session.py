"""The paper loop: bars from a feed through the ensemble, one streaming state per symbol; each
bar's pending order filled, its decision made an order, everything booked in one transaction.

Per bar (:meth:`PaperSession.on_bar`): a new trading date resets the day's loss (and ends a
pause); a stale gap before the bar flattens at its open (an order replacing the position decided
at the last close: its fill's ``gap_usd`` is from that close, so the ledger's PnL is the backtest of
its positions less the gaps, stale flats included); the pending order fills
(:class:`~foxhunt.paper.fills.FillModel`); the ensemble steps the bar
(:meth:`foxhunt.ensemble.engine.StreamingEngine.step_many`); the limits are checked on the
marked equity (:mod:`foxhunt.paper.risk`); the target (flat when a limit has tripped) becomes
the next order; the ledger commits it all (:meth:`foxhunt.paper.ledger.Ledger.record_bar`).
Bars before the traded window only prime the features (as ``replay`` does: the members start
fresh at the first traded bar), so on a replayed split the positions are ``replay``'s.

On a restart (:meth:`PaperSession.resume`) nothing the ledger holds is taken on trust: the
session replays the stored bars (a file feed: the feed's own bars, so an edited or deleted bar
is seen too) through this same loop, the events a live feed's heartbeats wrote between bars
where they happened, into a scratch ledger in memory; the ledger must hold exactly what the
replay booked (:meth:`foxhunt.paper.ledger.Ledger.compare`: every decision, order, fill, cash
figure, position, mark, risk state and event), else one line and nothing written. The members'
states, the accounts, the pending orders, the limits' state and which gaps were already
flattened are then the replay's, an uninterrupted run's, and the feed goes on after the last
bar stored.

**Versions.** Each traded bar is stored with the member versions that decided it
(``bars.versions``). With a :class:`~foxhunt.ensemble.loading.VersionWatcher` (``roll.swap``), a
version promoted while the session runs is loaded and checked on the watcher's thread and
swapped in at the start of the next traded bar, before its decision
(:meth:`foxhunt.ensemble.loading.SwappableEngine.swap`: warmed on the streams' latest bars), with a
``swap`` event on that bar; a version that fails is one line, the old one keeps deciding. A
resume replays each stored bar with the versions stored with it (loaded through ``loader``, so
verified as at start), swapping where they change, exactly as the session did.

The loop's own cost per bar is measured as ``time.perf_counter_ns`` around :meth:`on_bar`
less the engine's own time for the bar (``BarResult.total_ns``: features, members, rule).
Written by hand: it is foxhunt's own composition of its engine, fill model, limits and ledger.
"""

from __future__ import annotations

import math
import sqlite3
import time
from dataclasses import dataclass, field

import numpy as np

from foxhunt.config.schema import MAX_STEPS
from foxhunt.data.calendar import MINUTE_NS
from foxhunt.ensemble.loading import SwapError, VersionWatcher
from foxhunt.errors import UserError, one_line_error
from foxhunt.paper.fills import Account, FillModel, Order, check_money
from foxhunt.paper.ledger import LedgerError
from foxhunt.paper.risk import ACTIVE, STOPPED, RiskLimits, RiskState


@dataclass
class Latest:
    """What the view shows of the last bar."""

    bar: object = None
    decisions: dict = field(default_factory=dict)
    position: int = 0
    ensemble_ns: int = 0
    loop_ns: int = 0
    events: list[str] = field(default_factory=list)


class PaperSession:
    """The loop (module doc). ``members``: the loaded members, in the engine's order (their versions
    are stored with each bar); ``loader(name, version, weights)``: a stored bar's version, loaded
    (a resume); ``watcher``: hot swap, set once the session resumed; ``holdout``: the lockbox the
    session keeps (a swapped-in version must keep the same)."""

    def __init__(self, engine, ledger, fills: FillModel, risk: RiskLimits, capital: float, multiplier: float,
                 members: list | None = None, loader=None, holdout: float | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.members = {f.name: f for f in members or []}
        self.loaded = dict(self.members)  # what the session was started with (the aliases now): it trades on after a resume
        self.loader = loader
        self.watcher: VersionWatcher | None = None
        self.holdout = holdout or None
        self._replaying = False
        self.ledger = ledger
        self.fills = fills
        self.risk = risk
        self.capital = check_money(float(capital), f"paper.capital_usd={float(capital):g}")
        self.multiplier = float(multiplier)
        self.accounts: dict[str, Account] = {}
        self.state = RiskState(peak=self.capital, day_start=self.capital)
        self.streams: dict = {}
        self.last_ts: dict[str, int] = {}
        self.trading: set[str] = set()  # symbols whose members have started (first traded bar seen)
        self.latest = Latest()
        self.added_ns: list[int] = []
        self.ensemble_ns: list[int] = []
        self.bars = 0
        self.resumed_bars = 0
        self.swapped_back: list[str] = []  # what a resume swapped back to the members loaded at start
        self.stale_flagged: set[str] = set()
        self.done = False
        self.priming: list = []

    # -- state -----------------------------------------------------------------------------
    def account(self, symbol: str) -> Account:
        if symbol not in self.accounts:
            self.accounts[symbol] = Account(symbol, cash=self.capital if not self.accounts else 0.0, multiplier=self.multiplier)
        return self.accounts[symbol]

    def stream(self, symbol: str):
        if symbol not in self.streams:
            self.streams[symbol] = self.engine.open_stream(symbol)
        return self.streams[symbol]

    @property
    def versions(self) -> str:
        """The members deciding now, as a bar stores them (``name:version:weights``, joined by ``,``)."""
        return ",".join(self.members[m.name].label for m in self.engine.members) if self.members else ""

    @property
    def equity(self) -> float:
        return sum(a.equity for a in self.accounts.values()) if self.accounts else self.capital

    def resume(self, history=None) -> int | None:
        """Replay and check the ledger (module doc); the last bar time stored (None: nothing
        stored). ``history(n)``: the feed's first ``n`` bars (a file feed), else the stored bars
        are replayed."""
        real = self.ledger
        try:
            stored = real.stored_bars()
            if not stored:
                return None
            versions = real.stored_versions()
            beats = real.between_events()
        except sqlite3.DatabaseError as exc:  # text that is not UTF-8, a value of another type: an edited file
            raise _unreadable(real, exc) from None
        if history is not None and beats:  # heartbeats come from a live feed's polls only
            raise LedgerError(f"{real.where}: holds {sum(map(len, beats.values()))} event(s) between bars (a live feed's "
                              "heartbeats), but its bars come from a file, which has none: the ledger was edited; "
                              "nothing was written")  # fmt: skip
        bars = stored if history is None else list(history(len(stored)))
        replayed = real.scratch(real.identity)
        self.ledger = replayed
        self._replaying = True
        try:
            first = next(((seq, v) for seq, v in enumerate(versions, 1) if v), None)
            if first is not None:  # the versions the session started with, fresh (no stream has read a bar)
                try:
                    self._swap(first[1])
                except UserError as exc:
                    raise LedgerError(
                        f"{real.where}: its bar {first[0]}: {one_line_error(exc, with_type=False)}; nothing was written"
                    ) from None
            for seq, bar in enumerate(bars, 1):
                try:
                    self.on_bar(bar, versions[seq - 1] if seq <= len(versions) else None)
                except UserError as exc:
                    at = np.datetime64(int(bar.ts_ns), "ns").astype("datetime64[s]")
                    raise LedgerError(f"{real.where}: replaying its bar {seq} at {at}: {one_line_error(exc, with_type=False)}; "
                                      "nothing was written") from None  # fmt: skip
                for now in beats.get(seq, ()):
                    self.heartbeat(now)
            if self.priming:  # stored on their own (the run ended before its first traded bar)
                replayed.record_priming(self.priming)
                self.priming = []
            try:
                real.compare(replayed)
            except sqlite3.DatabaseError as exc:
                raise _unreadable(real, exc) from None
            real.adopt(replayed)
        finally:
            self.ledger = real
            self._replaying = False
            replayed.close()
        self.resumed_bars = len(stored)
        self.bars, self.added_ns, self.ensemble_ns, self.latest = 0, [], [], Latest()
        self.swapped_back = self._back_to_loaded()
        return max(self.last_ts.values())

    def _back_to_loaded(self) -> list[str]:
        """After the replay (which swapped in each stored bar's versions), the members the session
        was started with, warmed on the replayed bars as a live swap warms them: a resumed session
        traded on with its last stored bar's versions, so a version rolled back since traded again
        (found by a helper probing the roll). One line per member swapped."""
        lines = []
        for name, found in self.loaded.items():
            old = self.members.get(name)
            if old is None or old is found or old.label == found.label:  # the same version decides on
                continue
            warmed = self.engine.swap(found.member, found.inputs, found.value, list(self.streams.values()))
            self.members[name] = found
            lines.append(f"{name} v{old.version} -> v{found.version} ({found.member.weights}) as the session resumed, warmed on "
                         f"{warmed} bars")  # fmt: skip
        return lines

    # -- bars ------------------------------------------------------------------------------
    def on_bar(self, bar, versions: str | None = None) -> None:
        """One bar (module doc); ``versions``: the members that decided it (a resume's stored bar)."""
        started = time.perf_counter_ns()
        symbol = bar.symbol
        stream = self.stream(symbol)
        account = self.account(symbol)
        self.engine.check(stream, bar.values)  # a bad bar: its BarDataError, nothing changed or written
        if not bar.trade:
            self.engine.warm(*bar.values, stream=stream)
            self.last_ts[symbol] = bar.ts_ns
            self.priming.append(bar)  # stored in one transaction at the first traded bar
            return
        if self.priming:
            self.ledger.record_priming(self.priming)
            self.priming = []
        if symbol not in self.trading:
            self.engine.reset_members(stream)
            self.trading.add(symbol)
        events: list[tuple[str, str]] = []
        line = self.risk.new_bar(self.state, bar.ts_ns, self.equity)
        if line:
            events.append(("resume", line))
        stale = self.risk.stale(self.last_ts.get(symbol), bar.ts_ns) if symbol in self.last_ts else None
        stale_order, replaced = None, False  # the flat placed at this bar's open, the pending order it replaced
        if stale and symbol not in self.stale_flagged:
            rolled = not math.isnan(bar.roll_price)
            where = ("the old contract's last close (a roll bar)" if rolled else
                     "this bar's open" if self.fills.at_open else "the last close (paper.fill_price=decision_close)")  # fmt: skip
            events.append(("stale", f"{stale}: flattened at {where}"))
            replaced = account.pending is not None
            account.pending = None
            if account.position:
                # the flat replaces the position decided at the last close (the mark, the replaced order's
                # reference): its fill books the gap from there, as every order's (next_open: this bar's open;
                # decision_close and a roll bar, whose position is in the old contract: that close itself)
                stale_order = account.pending = Order(symbol, bar.ts_ns, 0, -account.position, "stale feed", account.mark)
        self.stale_flagged.discard(symbol)
        fills = self.fills.on_bar(account, bar)
        events += [("swap", line) for line in self._swap(versions)]
        result = self.engine.step_many([(stream, bar.values)])[0]
        if isinstance(result, Exception):
            raise result
        self.last_ts[symbol] = bar.ts_ns
        target = result.position if result.warm else 0
        reason = "signal"
        if self.state.status == ACTIVE:
            breach = self.risk.breach(self.state, self.equity, {symbol: target})
            if breach:
                then = self.risk.trip(self.state, breach)
                events.append(("breach", f"{breach}: flatten, then {then}"))
        else:
            self.state.peak = max(self.state.peak, self.equity)
        if self.state.status != ACTIVE:
            target, reason = 0, f"risk: {self.state.reason}"
        order = self.fills.order(account, bar, target, reason)
        account.pending = order
        stepped = result.total_ns
        loop = time.perf_counter_ns() - started - stepped  # before the commit is timed too: added below
        self.ledger.record_bar(bar, account, fills, order, self.state, events, result.position if result.warm else 0, stepped, loop,
                               stale_order=stale_order, replaced=replaced, versions=self.versions)  # fmt: skip
        added = time.perf_counter_ns() - started - stepped
        self.added_ns.append(added)
        self.ensemble_ns.append(stepped)
        self.bars += 1
        self.latest = Latest(bar, result.decisions, target, stepped, added, [m for _, m in events] or self.latest.events)
        if self.state.status == STOPPED and account.pending is None and all(a.position == 0 for a in self.accounts.values()):
            self.done = True

    # -- versions ----------------------------------------------------------------------------
    def _swap(self, recorded: str | None) -> list[str]:
        """Swap in, before this bar's decision, the versions stored with it (a resume) or those
        the watcher loaded (live); one line per member swapped."""
        if not self.members:
            return []
        watcher = self.watcher
        if self._replaying:
            wanted = self._parse(recorded)
            todo = [self.loader(name, version, weights) for name, version, weights in wanted
                    if self.members[name].label != f"{name}:{version}:{weights}"]  # fmt: skip
        elif watcher is not None:
            todo = watcher.take()
        else:
            return []
        lines = []
        for found in todo:
            old = self.members[found.name]
            try:
                if (found.holdout or None) != self.holdout:
                    raise SwapError(
                        f"it was trained keeping evaluation.holdout={found.holdout}, the session keeps {self.holdout}"
                    )
                warmed = self.engine.swap(found.member, found.inputs, found.value, list(self.streams.values()))
            except SwapError as exc:
                if self._replaying or watcher is None:  # not replaying: the watcher found it
                    raise
                watcher.refused(found, str(exc))
                continue
            self.members[found.name] = found
            if not self._replaying and watcher is not None:
                watcher.swapped(found)
            lines.append(f"{found.name} v{old.version} -> v{found.version} ({found.member.weights}), warmed on {warmed} bars")
        return lines

    def _parse(self, recorded: str | None) -> list[tuple[str, int, str]]:
        """A stored bar's versions, checked: the ensemble's members, in order, each a version and its weights."""
        names = list(self.members)
        parts = [item.split(":") for item in (recorded or "").split(",")]
        ok = len(parts) == len(names) and all(
            len(p) == 3 and p[0] == name and _version_number(p[1]) and p[2] in ("fp32", "int8") for p, name in zip(parts, names))  # fmt: skip
        if not ok:
            raise LedgerError(f"its versions are {recorded!r}, not those of this ensemble's members ({', '.join(names)}, each "
                              "name:version:fp32|int8): the ledger was edited")  # fmt: skip
        return [(p[0], int(p[1]), p[2]) for p in parts]

    def heartbeat(self, now_ns: int) -> None:
        """No bar within the feed's poll interval (a live feed): a stale symbol is flattened
        (its order fills at the next bar's open) and the event recorded, once per gap."""
        for symbol, last in self.last_ts.items():
            if symbol in self.stale_flagged:
                continue
            stale = self.risk.stale(last, now_ns)
            if not stale:
                continue
            self.stale_flagged.add(symbol)
            account = self.account(symbol)
            order = None
            if account.position:
                order = Order(symbol, last + MINUTE_NS, 0, -account.position, "stale feed", account.mark)
            account.pending = order
            self.ledger.record_event(
                now_ns, symbol, "stale", f"{stale}: flatten at the next bar's open", account, self.state, order
            )
            self.latest.events = [stale]

    def run(self, feed, should_stop, view=None, clock=time.time_ns) -> str:
        """Drive the feed until it ends, ``should_stop()`` or a stopping limit; why it ended. A
        resumed session a limit stopped (flat, nothing pending) ends before its first bar: it
        booked one more flat bar on each restart (found by a helper probing the paper ledger)."""
        if self.done:
            return f"stopped by a risk limit: {self.state.reason}"
        for item in feed:
            if should_stop():
                return "stopped by signal"
            if item is None:
                self.heartbeat(clock())
            else:
                self.on_bar(item)
            if view is not None:
                view.update(self)
            if self.done:
                return f"stopped by a risk limit: {self.state.reason}"
        return "stopped by signal" if should_stop() else "the feed ended"  # a feed ends early on a signal


def _version_number(text: str) -> bool:
    """A registered version as a ledger stores it: ASCII digits of a number in ensemble.versions'
    range, [1, MAX_STEPS] (``str.isdigit`` also takes '²', which ``int`` refuses)."""
    return text.isascii() and text.isdigit() and len(text) <= 10 and 1 <= int(text) <= MAX_STEPS


def _unreadable(ledger, exc: sqlite3.DatabaseError) -> LedgerError:
    """A ledger whose cells sqlite3 cannot read back (text that is not UTF-8, a value of another type)."""
    return LedgerError(
        f"{ledger.where}: unreadable ({one_line_error(exc, limit=160)}): the ledger was edited; nothing was written"
    )
