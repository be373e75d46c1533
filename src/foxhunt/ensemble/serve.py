"""The ensemble behind HTTP: ``foxhunt ensemble serve``.

One process: uvicorn serves a Starlette app, and the ensemble runs in the same process on one
compute thread, so a request costs the ensemble's own work plus parsing, never a hop to another
process. Requests that arrive while the ensemble is busy wait in a queue; the compute thread takes
everything waiting (at most ``ensemble.serve.max_batch`` requests, one per symbol: a symbol's
bars stay in order) and steps all their streams at once (:meth:`foxhunt.ensemble.engine.StreamingEngine.step_many`:
one batched call per member), so eight clients on eight symbols cost about 3.3 single-symbol
steps on a 2-core CPU, not eight (the ensemble's 213 predictions/s at one symbol against 512 at
eight, ``scripts/benchmark.py --sections ensemble``, docs/benchmarks.md 2026-12-02: the TFT's step
grows with the batch). A request of many bars is stepped ``slice_bars`` (8) bars a batch and
goes on in the next batch, ahead of its symbol's later requests: another symbol's live bar waits
behind a 500-bar history for a slice, not for the whole history (it did before). A swap waits
until no request is part-answered, so one set of members answers each request (a member swapped
in meanwhile answered the rest of a history, unsaid: found by a helper probing the roll); while
a swap waits, new requests wait for it, so requests that overlap cannot keep it out. Measured:
``scripts/load_test.py`` reports the in-process ensemble beside the HTTP round trip.

API (JSON, on ``127.0.0.1`` by default):

- ``POST /predict`` ``{"symbol": "ES", "bars": [{"ts": 1717200000000000000 | "2024-06-01T00:00:00Z",
  "open": ..., "high": ..., "low": ..., "close": ..., "volume": ...}, ...]}`` (or ``"bar": {...}``
  for one bar): the bars go, in order, into the symbol's own stream (features, members' states),
  and the answer is one result per bar: ``{"ts", "warm", "position"`` (the ensemble's),
  ``"members": {name: {"position", "signal"}}``, ``"latency_us"}`` (``signal`` is ``null`` for
  an agent and a forecaster not yet warm: the body is strict JSON, never ``NaN``), and
  ``timing_us``: where the request's time went in the server (``time.perf_counter_ns``): reading
  and parsing the body, waiting for the compute thread, the ensemble's work on its batch, the whole handler.
- ``GET /health``: ``ok`` (the ensemble is loaded before the server listens); ``GET /info``: the
  members (version, run, runtime, weights), the symbols, the limits, the bytes one symbol's
  stream holds (measured: every member's slot and the feature windows), the uptime.

Every request the server refuses is a 4xx with ``{"detail": one line naming the field and the
problem}``, never a 500: a body that is not JSON, not UTF-8 or not an object (400), over
``max_body_bytes`` (413), more bars than ``max_bars_per_request`` (400), a value out of range
(a price above the tick grid's exact range, a time outside 1970..2200, a 400-digit number: 400),
a bad bar (out of order, a price below one tick or off the tick grid: 400, by the one price rule
of :func:`foxhunt.data.bars.price_problem`; the bars before it in the request were applied, it
and those after it not), a symbol not allowed (403) or one too many (429, see below), a body
not complete in time (408, see below), and a request still unanswered ``timeout_s`` after it
arrived, queue time included (504: the bars applied by then are said). A request beyond the
connection cap is a 503 (see below).

**Clients are bounded** (:class:`Guard`; uvicorn offers a keep-alive timeout and a graceful
shutdown, used here, but no read timeout, and its ``limit_concurrency`` answers 503 while it
keeps every idle socket open, so the bounds are foxhunt's, on uvicorn's h11 protocol):

- *in time*: a connection sends its request headers within ``read_timeout_s`` of connecting (or
  of its previous answer), else it is closed, with a 408 when part of a request came (a client
  dripping header bytes is closed too: bytes do not restart the clock); a body pauses no longer
  than ``read_timeout_s``, arrives at ``min_body_rate`` bytes/s on average from ``body_grace_s``
  after its headers on, and is complete within ``timeout_s`` of them, else a 408 and the
  connection is closed (a chunk shorter than it declared, a byte a second: such a client holds a
  request slot for about ``body_grace_s``, so 256 of them no longer keep every request at 503
  for ``timeout_s``);
- *in count*: at most ``max_connections`` requests are in progress (body arriving, queued or
  stepped); one more is a 503 and its connection closed. ``GET /health`` is exempt: it is
  answered whatever the load, on the ``health_reserve`` sockets kept above the cap. At most
  ``max_connections + health_reserve`` sockets are open: a new connection beyond them closes the
  connection idle longest (no request in progress), so idle and half-sent sockets can never
  lock out a new client, and the process's file descriptors (raised to what these limits need
  at start, or a one-line config error) never run out;
- *in the log*: each kind of event (a timeout, the cap, a client gone, a bug's traceback,
  uvicorn's and asyncio's own lines) is written once per ``log_interval_s``; the others of its
  kind in that interval are one line with their count (:class:`RateLimitedLog`). A socket error
  is one line, never a traceback. ``GET /info`` counts every event since the start.

**Symbols are bounded.** ``ensemble.serve.symbols`` (a list) admits only those; at most
``max_symbols`` streams live at once, a stream idle for ``idle_evict_s`` seconds is dropped
(its slots reused; the default, four days, outlasts CME's daily halt and a weekend, where a
dropped stream would restart cold). Beyond the limit a new symbol takes the place of the cold
stream (its feature windows never filled) seen longest ago: symbols made up to fill the table, or
sent a few bars and gone, hold no decision anyone waits for and can never lock a real symbol out;
with every stream warm it is a 429 whose ``Retry-After`` says when the stream seen longest ago
will have been idle long enough to be dropped. A stream is created only once its first bar passed
the checks, so a refused request holds no memory. Starlette's own refusals (an unknown path, 404;
a wrong method, 405) are JSON lines too, and a trailing slash is a 404, never a redirect.

**Resends are answered.** A client whose answer was lost (its connection closed before it read
it, a 504 after some bars were applied) resends the request: the bars its symbol's stream
applied already are answered from its last ``ensemble.serve.resend_bars`` answers (flagged
``resent``), the new ones stepped; a resent bar that differs from the applied one is a 400.

**Hot swap** (``roll.swap.poll_s``): a :class:`~foxhunt.ensemble.loading.VersionWatcher` looks at the
registry while the server runs; a promoted version is loaded and checked on the watcher's thread
(its files against their digests, its stored config) while requests are answered, then swapped
in on the compute thread between two batches, so between two bars of every symbol: it first
steps through each symbol's latest bars (``roll.swap.warm_bars``), then answers the next. No
request waits for the loading, none fails, no bar is skipped or decided twice; ``GET /info``
names the versions deciding, the swaps done and, under ``refused``, each version the registry
names that fails to load or to swap in (and why): it is one line in the log, the old one keeps
answering, and it is tried again ``roll.swap.retry_s`` later.

**Stopping.** SIGTERM or Ctrl-C: uvicorn stops accepting, idle connections are closed, a body
still arriving is a 503 at once, the requests the ensemble has are answered (within
``shutdown_grace_s``; one still running then is a 503), the process exits 0 without a
traceback, and the folder the ensemble was read into is removed.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import datetime
import gc
import inspect
import json
import logging
import math
import os
import re
import resource
import signal
import socket
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from hydra.utils import instantiate
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from foxhunt.data.errors import BarDataError
from foxhunt.ensemble.loading import SwapError, VersionWatcher, ensemble_engine, load_ensemble
from foxhunt.errors import ConfigError, UserError

log = logging.getLogger(__name__)
SYMBOL = re.compile(r"[A-Za-z0-9._:-]{1,32}")  # the whole symbol (fullmatch: re's $ matches before a trailing newline)
BAR_KEYS = ("ts", "open", "high", "low", "close", "volume")
JSON_TYPES = ("application/json",)
HEALTH_PATH = "/health"  # answered whatever the load (exempt from max_connections)


MAX_DETAIL = 400  # characters of a refusal's detail


class BadRequest(ValueError):
    """A request the server refuses (one line); ``status`` is its HTTP status; ``close``: the
    connection is closed after the answer (the rest of its body is never read)."""

    def __init__(self, message: str, status: int = 400, close: bool = False, retry_after_s: int | None = None) -> None:
        # a detail quoting what the client sent is cut: a 4,000-digit ts came back whole (8 KB)
        super().__init__(message if len(message) <= MAX_DETAIL else message[: MAX_DETAIL - 3] + "...")
        self.status = status
        self.close = close
        self.retry_after_s = retry_after_s  # a Retry-After header: when trying again can succeed


class ClientGone(Exception):
    """The client closed its connection before its request's body was complete."""


#: An ISO-8601 (RFC 3339) bar start with its zone: date, time to the minute or second with up to
#: nine fraction digits, ``Z`` or a ``+hh:mm`` / ``+hhmm`` / ``+hh`` offset. Nothing else: a
#: general date parser (pandas falls through to dateutil) reads "13:30 UTC+5" as 18:30Z (POSIX
#: signs) and "03/06/2024" as 6 March, and takes time quadratic in the string's length.
ISO_TS = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<h>\d{2}):(?P<m>\d{2})(?::(?P<s>\d{2})(?:[.,](?P<frac>\d{1,9}))?)?"
    r"(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>\d{2})(?::?(?P<om>\d{2}))?)",
    re.ASCII,
)
ISO_TS_MAX_LENGTH = 40  # the longest form: 2024-06-03T13:30:00.123456789+05:30 (35 characters)
TS_FORMS = "integer nanoseconds or an ISO-8601 time with a zone, e.g. 2024-06-03T13:30:00Z"


def parse_ts(value: Any) -> int:
    """A bar start as UTC nanoseconds: an integer (ns since the epoch) or an ISO-8601 string
    with a zone (:data:`ISO_TS`). Range checks are the stream's (1970..2200)."""
    if isinstance(value, bool):
        raise BadRequest(f"ts={value!r}: expected {TS_FORMS}")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise BadRequest(f"ts={_as_json(value)}: expected {TS_FORMS}")
    match = ISO_TS.fullmatch(value) if len(value) <= ISO_TS_MAX_LENGTH else None
    if match is None:
        if len(value) <= ISO_TS_MAX_LENGTH and re.fullmatch(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}([.,]\d+)?)?", value):
            raise BadRequest(f"ts={value!r}: no time zone (add Z for UTC)")
        raise BadRequest(f"ts={value[:64]!r}: expected {TS_FORMS}")
    try:
        day = datetime.date.fromisoformat(match["date"])
        clock = datetime.time(int(match["h"]), int(match["m"]), int(match["s"] or 0))
        offset = datetime.timedelta(hours=int(match["oh"] or 0), minutes=int(match["om"] or 0))
        if offset >= datetime.timedelta(days=1):
            raise ValueError("offset of a day or more")
    except ValueError as exc:  # month 13, 25:00, a 24-hour offset
        raise BadRequest(f"ts={value!r}: not a valid time ({exc})") from None
    local = datetime.datetime.combine(day, clock, tzinfo=datetime.timezone.utc)
    seconds = calendar.timegm(local.timetuple()) - (-1 if match["sign"] == "-" else 1) * int(offset.total_seconds())
    fraction = int((match["frac"] or "").ljust(9, "0"))
    return seconds * 1_000_000_000 + fraction


def _as_json(value: Any) -> str:
    """A request's value as the client wrote it (JSON: ``null``, ``true``, ``"x"``), cut to 64 characters."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 64 else text[:61] + "..."


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{where}={_as_json(value)}: expected a number")
    try:
        number = float(value)
    except OverflowError:
        raise BadRequest(f"{where}: a number too large for a float ({len(str(value))} digits)") from None
    if not math.isfinite(number):
        raise BadRequest(f"{where}={number!r}: expected a finite number")
    return number


def parse_request(request: Any, max_bars: int) -> tuple[str, list[tuple]]:
    """(symbol, bars as (ts_ns, open, high, low, close, volume)) of a request body."""
    if not isinstance(request, dict):
        raise BadRequest("body: expected a JSON object with symbol and bars")
    symbol = request.get("symbol")
    if not isinstance(symbol, str) or not SYMBOL.fullmatch(symbol):
        raise BadRequest(f"symbol={_as_json(symbol)}: expected 1-32 letters, digits or ._:-")
    if "bar" in request and "bars" in request:  # one was silently ignored
        raise BadRequest("body: both bar and bars given: send one bar, or a list of bars")
    bars = request.get("bars", [request["bar"]] if "bar" in request else None)
    if not isinstance(bars, list) or not bars:
        raise BadRequest("bars: expected a non-empty list of bars (or bar: one bar)")
    if len(bars) > max_bars:
        raise BadRequest(f"bars: {len(bars)} bars in one request, at most {max_bars} (ensemble.serve.max_bars_per_request)")
    parsed = []
    for i, bar in enumerate(bars):
        if not isinstance(bar, dict):
            raise BadRequest(f"bars[{i}]: expected an object with {', '.join(BAR_KEYS)}")
        missing = [k for k in BAR_KEYS if k not in bar]
        if missing:
            raise BadRequest(f"bars[{i}]: missing {', '.join(missing)}")
        values = [_number(bar[key], f"bars[{i}].{key}") for key in BAR_KEYS[1:]]
        parsed.append((parse_ts(bar["ts"]), *values))
        if i and parsed[i][0] <= parsed[i - 1][0]:  # a resent prefix was matched bar by bar, in any order and repeated
            raise BadRequest(f"bars[{i}]: ts {parsed[i][0]} is not after bars[{i - 1}]'s {parsed[i - 1][0]} (a request's "
                             "bars are in time order, each once); nothing applied")  # fmt: skip
    return symbol, parsed


def result_json(result) -> dict:
    return {
        "ts": int(result.ts_ns),
        "warm": result.warm,
        "position": int(result.position),
        "members": {
            name: {
                "position": int(d.position),
                "signal": None if d.signal is None or not math.isfinite(d.signal) else float(d.signal),
            }
            for name, d in result.decisions.items()
        },
        "latency_us": result.total_ns / 1e3,
    }


@dataclass
class Limits:
    """``ensemble.serve``: what one server admits."""

    max_symbols: int
    symbols: list[str] | None
    idle_evict_s: float | None
    max_bars_per_request: int
    max_body_bytes: int
    max_batch: int
    timeout_s: float
    read_timeout_s: float
    max_connections: int
    health_reserve: int
    log_interval_s: float
    shutdown_grace_s: float
    resend_bars: int  # answers kept per symbol for an identical resend (EnsembleService._resent)
    min_body_rate: int  # bytes/s a body arrives at on average, from body_grace_s after its headers on (_read_body)
    body_grace_s: float
    slice_bars: int  # rounds (bars of each request) per batch; a request with more goes on in the next (EnsembleService.answer)

    @classmethod
    def from_config(cls, node) -> Limits:
        """The limits of ``node`` (``ensemble.serve``, validated: ``--timeout`` is its
        ``timeout_s``); the process's file-descriptor limit is made to fit them here, before the
        ensemble loads (:func:`reserve_descriptors`)."""
        values = {k: node[k] for k in cls.__dataclass_fields__}
        values["symbols"] = list(values["symbols"]) if values["symbols"] is not None else None
        limits = cls(**values)
        reserve_descriptors(limits)
        return limits

    @property
    def max_sockets(self) -> int:
        """Client sockets open at once, at most."""
        return self.max_connections + self.health_reserve


def listen_backlog() -> int:
    """uvicorn's listen backlog (its default: connections the kernel completes before the server
    accepts them, and as many as asyncio accepts at once before the cap closes any; a short one
    would drop a /health connection's SYN in a burst, a retry a second later)."""
    return int(inspect.signature(uvicorn.Config).parameters["backlog"].default)


def reserve_descriptors(limits: Limits) -> int:
    """Raise the soft RLIMIT_NOFILE (up to the hard one) to what the server may need: the files
    open now, twice (the ensemble's files and runtimes open next), ``max_connections +
    health_reserve`` client sockets and the :func:`listen_backlog` accepted at once; a hard limit
    below that is a one-line :class:`~foxhunt.errors.ConfigError` naming
    ``ensemble.serve.max_connections``. Returns the soft limit."""
    open_now = len(os.listdir("/dev/fd"))
    need = 2 * open_now + limits.max_sockets + listen_backlog()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(f"ensemble.serve.max_connections={limits.max_connections}: with health_reserve={limits.health_reserve}, "
                          f"the {open_now} files open and up to {listen_backlog()} connections accepted at once (uvicorn's listen "
                          f"backlog), the server may need {need} file descriptors; this process may open {hard} (ulimit -Hn): "
                          f"raise the hard limit or lower ensemble.serve.max_connections")  # fmt: skip
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return need


@dataclass
class Pending:
    """A request waiting for the ensemble: its bars, when it must be answered by, its answer."""

    symbol: str
    bars: list[tuple]
    deadline: float  # time.monotonic()
    results: list[dict] = field(default_factory=list)
    error: BadRequest | None = None
    resent: int = 0  # leading bars answered from the stream's recent answers (an identical resend)
    started_ns: int = 0  # perf_counter_ns when the compute thread took it (its first batch began)
    done_ns: int = 0  # ... and when its last bar was answered
    stream: Any = None  # its symbol's stream, once taken: a request with bars left after a batch goes on in the next


class EnsembleService:
    """The ensemble with one stream per symbol (the part of the server that knows no HTTP)."""

    def __init__(self, cfg, workdir: Path, limits: Limits) -> None:
        self.cfg = cfg
        self.limits = limits
        self.asset = instantiate(cfg.asset)
        self.members = load_ensemble(cfg, workdir)
        self.engine = ensemble_engine(self.members, self.asset, cfg, origin="symbol")
        self.streams: OrderedDict[str, Any] = OrderedDict()  # symbol -> Stream, least recently used first
        self.started = time.monotonic()
        self.stream_bytes = self.engine.stream_bytes()
        self.answered = 0
        self.answers: dict[str, OrderedDict] = {}  # symbol -> its last answers by bar start (_remember, _resent)
        self.cold_evicted = 0  # cold streams that made room for a new symbol at max_symbols (_make_room)
        self.continuing: set[str] = set()  # symbols of requests with bars left after the last batch (answer)
        self.workdir = workdir
        self.watcher: VersionWatcher | None = None
        self.swaps: list[str] = []  # one line per member swapped in

    def watch(self) -> None:
        """Start looking for promoted versions (``roll.swap.poll_s``; module doc, "Hot swap")."""
        swap = self.cfg.roll.swap if self.cfg.get("roll") is not None else None
        if swap is not None and swap.poll_s is not None and self.watcher is None:
            self.watcher = VersionWatcher(self.cfg, self.workdir, {f.name: f.version for f in self.members},
                                          lambda line: log.warning("foxhunt ensemble serve: %s", line)).start()  # fmt: skip

    def stop_watching(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def apply_swaps(self) -> None:
        """Swap in what the watcher has loaded (on the compute thread, between two batches): /info
        calls it first, so it names the members that decide the next bar (with no traffic it named
        the old ones until a request came: found by a helper probing the roll)."""
        if self.watcher is not None:
            self._swap(self.watcher)

    def _swap(self, watcher: VersionWatcher) -> None:
        """Swap in what the watcher loaded, between two batches (on the compute thread) with no
        request part-answered (module doc): until then it waits with the watcher, and new
        requests wait for it (:meth:`answer`)."""
        if self.continuing:
            return
        for found in watcher.take():
            index = next(i for i, f in enumerate(self.members) if f.name == found.name)
            old = self.members[index]
            try:
                warmed = self.engine.swap(found.member, found.inputs, found.value, list(self.streams.values()))
            except SwapError as exc:
                watcher.refused(found, str(exc))
                continue
            self.members[index] = found
            watcher.swapped(found)
            line = (f"{found.name} v{old.version} -> v{found.version} ({found.member.weights}), warmed on up to {warmed} bars "
                    f"of {len(self.streams)} symbol(s)")  # fmt: skip
            self.swaps.append(line)  # never held back by the rate limit (one template: a two-family swap logged one family)
            log.warning("foxhunt ensemble serve: swapped %s", line, extra={RateLimitedLog.SUMMARY: True})

    def info(self) -> dict:
        return {
            "asset": str(self.asset.key), "rule": str(self.cfg.ensemble.rule),
            "members": {f.member.name: {"version": f.version, "run_id": f.run_id, "runtime": f.member.runtime,
                                        "weights": f.member.weights, "trained_precision": f.precision} for f in self.members},
            "symbols": len(self.streams), "symbols_warm": sum(s.features_warm for s in self.streams.values()),
            "max_symbols": self.limits.max_symbols,
            "allowed_symbols": self.limits.symbols, "idle_evict_s": self.limits.idle_evict_s,
            "max_bars_per_request": self.limits.max_bars_per_request, "max_body_bytes": self.limits.max_body_bytes,
            "timeout_s": self.limits.timeout_s,
            "stream_bytes": self.stream_bytes,
            "stream_bytes_method": "one symbol's stream: every member's state slot (numpy nbytes) and its feature windows (sys.getsizeof)",
            "uptime_s": round(time.monotonic() - self.started, 3), "requests_answered": self.answered,
            "swaps": list(self.swaps), "cold_evicted": self.cold_evicted,
            "refused": dict(self.watcher.refusals) if self.watcher is not None else {},
        }  # fmt: skip

    def _evict_idle(self, now: float) -> None:
        idle = self.limits.idle_evict_s
        if idle is None:
            return
        for symbol, stream in list(self.streams.items()):  # least recently used first
            if now - stream.seen_monotonic < idle:
                break
            if symbol in self.continuing:  # a request is stepping it (answer): never closed under it
                continue
            self.engine.close_stream(self.streams.pop(symbol))
            self.answers.pop(symbol, None)

    def _make_room(self, symbol: str) -> None:
        """At ``max_symbols``, a new symbol takes the place of the stream seen longest ago among
        those still cold (their features never filled: a symbol sent a few bars and left, or one
        of many made up to fill the table), which holds no decision anyone waits for; with every
        stream warm it is a 429 that says when the first one may be evicted for idleness."""
        cold = next((name for name, stream in self.streams.items()
                     if not stream.features_warm and name not in self.continuing), None)  # fmt: skip
        if cold is not None:
            self.engine.close_stream(self.streams.pop(cold))
            self.answers.pop(cold, None)
            self.cold_evicted += 1
            return
        idle = self.limits.idle_evict_s
        oldest = next(iter(self.streams.values()))
        retry = None if idle is None else max(1, math.ceil(idle - (time.monotonic() - oldest.seen_monotonic)))
        raise BadRequest(f"symbol={symbol!r}: {len(self.streams)} symbols are streaming, every one warm, at most "
                         f"{self.limits.max_symbols} (ensemble.serve.max_symbols); try again later", 429,
                         retry_after_s=retry)  # fmt: skip

    def _stream(self, symbol: str, first_bar: tuple):
        """The symbol's stream; a new one only if the symbol is admitted and its first bar passes."""
        stream = self.streams.get(symbol)
        if stream is not None:
            self.streams.move_to_end(symbol)
            return stream
        if self.limits.symbols is not None and symbol not in self.limits.symbols:
            raise BadRequest(f"symbol={symbol!r}: not served here (ensemble.serve.symbols)", 403)
        if len(self.streams) >= self.limits.max_symbols:
            self._make_room(symbol)
        stream = self.engine.open_stream(symbol)
        try:
            self.engine.check(stream, first_bar)
        except Exception:
            self.engine.close_stream(stream)
            raise
        self.streams[symbol] = stream
        return stream

    def _resent(self, pending: Pending, stream) -> int:
        """Answer the leading bars of ``pending`` that its symbol's stream answered already, from
        its recent answers, flagged ``resent`` (a client whose answer was lost, by a closed
        connection or a 504, resends the request); returns how many. A bar at or before the
        stream's last one that is not one of them, or differs from it, is left to the stream's
        check (out of order: 400)."""
        recent = self.answers.get(pending.symbol)
        if recent and stream.last_bar_ns is not None:
            for bar in pending.bars:
                kept = recent.get(bar[0]) if bar[0] <= stream.last_bar_ns else None
                if kept is None or kept[0] != bar:
                    break
                pending.results.append({**kept[1], "resent": True})
                pending.resent += 1
        return pending.resent

    def _remember(self, symbol: str, bar: tuple, answer: dict) -> None:
        """Keep the symbol's last ``resend_bars`` answers (bar and answer, by bar start)."""
        if self.limits.resend_bars <= 0:
            return
        recent = self.answers.setdefault(symbol, OrderedDict())
        recent[bar[0]] = (bar, answer)
        while len(recent) > self.limits.resend_bars:
            recent.popitem(last=False)

    def answer(self, batch: list[Pending]) -> list[Pending]:
        """Step the bars of ``batch`` (distinct symbols), one bar of each request per round, for
        at most ``ensemble.serve.slice_bars`` rounds; returns the requests with bars left, which go
        on in the next batch (before any later request of their symbol), so that a long request
        delays the live bars of other symbols by a slice, not by its whole length."""
        if self.watcher is not None:
            self._swap(self.watcher)
        now = time.monotonic()
        began = time.perf_counter_ns()
        self._evict_idle(now)
        active: list[tuple[Pending, Any]] = []
        # a swap waits for the requests part-answered, and new ones wait for the swap: requests that overlapped
        # kept a loaded version out for ever (found reviewing the change that made the swap wait)
        swap_waiting = bool(self.continuing) and self.watcher is not None and self.watcher.has_ready()
        deferred: list[Pending] = []
        for pending in batch:
            if pending.stream is not None:  # a request going on from the last batch
                active.append((pending, pending.stream))
                continue
            if swap_waiting:
                deferred.append(pending)
                continue
            pending.started_ns = began
            try:
                stream = self._stream(pending.symbol, pending.bars[0])
            except BarDataError as exc:
                pending.error = BadRequest(f"bars[0]: {exc} (0 earlier bar(s) of this request applied)")
                continue
            except BadRequest as exc:
                pending.error = exc
                continue
            if self._resent(pending, stream) < len(pending.bars):
                active.append((pending, stream))
        for _ in range(self.limits.slice_bars):
            now = time.monotonic()
            late = [(p, s) for p, s in active if now > p.deadline]
            for pending, _ in late:
                pending.error = BadRequest(f"request timed out after {self.limits.timeout_s:g} s (ensemble.serve.timeout_s), "
                                           f"{len(pending.results)} of {len(pending.bars)} bar(s) applied (resend the request: "
                                           "the last ensemble.serve.resend_bars applied are answered again)", 504)  # fmt: skip
            active = [(p, s) for p, s in active if now <= p.deadline]
            if not active:
                break
            results = self.engine.step_many([(stream, pending.bars[len(pending.results)]) for pending, stream in active])
            still = []
            for (pending, stream), result in zip(active, results):
                at = len(pending.results)
                if isinstance(result, BarDataError):
                    pending.error = BadRequest(f"bars[{at}]: {result} ({at} earlier bar(s) of this request applied)")
                    continue
                answer = result_json(result)
                pending.results.append(answer)
                self._remember(pending.symbol, pending.bars[at], answer)
                if at + 1 < len(pending.bars):
                    still.append((pending, stream))
            active = still
        ended = time.perf_counter_ns()
        going_on = {id(pending): pending for pending, _ in active}
        for pending, stream in active:
            pending.stream = stream
        waiting = {id(pending) for pending in deferred}
        for pending in batch:
            if id(pending) not in going_on and id(pending) not in waiting:
                pending.done_ns, pending.stream = ended, None
                self.answered += 1
        self.continuing = {pending.symbol for pending in going_on.values()}
        return [*going_on.values(), *deferred]


class Batcher:
    """Requests queue here; one compute thread answers everything waiting at once (module doc)."""

    def __init__(self, service: EnsembleService) -> None:
        self.service = service
        self.queue: asyncio.Queue | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foxhunt-ensemble")
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.pool.shutdown(wait=True)

    def _started(self) -> asyncio.Queue:
        assert self.queue is not None, "Batcher.start() makes the queue"
        return self.queue

    async def submit(self, pending: Pending) -> Pending:
        done = asyncio.get_running_loop().create_future()
        await self._started().put((pending, done))
        return await done

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self._started()
        held: list = []  # a request whose symbol is in the batch already waits for the next one
        while True:
            items = held or [await queue.get()]
            held = []
            while not queue.empty() and len(items) < self.service.limits.max_batch:
                items.append(queue.get_nowait())
            batch, symbols = [], set()
            for item in items:
                if item[0].symbol in symbols:
                    held.append(item)
                else:
                    symbols.add(item[0].symbol)
                    batch.append(item)
            going_on: list = []
            try:
                going_on = await loop.run_in_executor(self.pool, self.service.answer, [p for p, _ in batch])
            except Exception as exc:  # a bug: every request of the batch gets it, the server goes on
                self.service.continuing = set()
                for pending, _ in batch:
                    pending.error = pending.error or BadRequest(f"internal error: {type(exc).__name__}: {exc}", 500)
            unfinished = {id(pending) for pending in going_on}
            # bars left: first in the next batch, ahead of later requests of the same symbol
            held = [item for item in batch if id(item[0]) in unfinished] + held
            for pending, done in batch:
                if id(pending) not in unfinished and not done.done():
                    done.set_result(pending)


@dataclass
class _Kind:
    """One kind of log event in its current interval."""

    since: float
    logger: str
    level: int
    text: str
    suppressed: int = 0


class RateLimitedLog(logging.Filter):
    """Each kind of event passes once per ``interval`` seconds; the others of that kind in the
    interval are counted and said in one line by :meth:`flush` (the server calls it every
    interval and when it stops). A kind is the logger, the first line of the message template
    and the exception's type. A record whose exception is an ``OSError`` (a socket reset, no
    file descriptor left) becomes one line, without its traceback; a bug's traceback is kept
    (the first of each interval)."""

    SUMMARY = "foxhunt_summary"  # a record's attribute: a count said by flush, never held back

    def __init__(self, interval: float, clock=time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self.kinds: dict[tuple, _Kind] = {}
        self.lock = threading.Lock()  # the ensemble's thread logs too

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, self.SUMMARY, False):
            return True
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OSError):
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {error}"
            record.args, record.exc_info, record.exc_text = None, None, None
        key = (record.name, str(record.msg).split("\n", 1)[0], type(error).__name__ if error is not None else None)
        now = self.clock()
        with self.lock:
            kind = self.kinds.get(key)
            if kind is not None and now - kind.since < self.interval:
                kind.suppressed += 1
                return False
            if kind is not None and kind.suppressed:
                self._say(kind, now)
            self.kinds[key] = _Kind(now, record.name, record.levelno, record.getMessage().split("\n", 1)[0])
        return True

    def flush(self, final: bool = False) -> None:
        """Say the count of each kind held back in an interval that is over (``final``: all)."""
        now = self.clock()
        with self.lock:
            for key, kind in list(self.kinds.items()):
                if final or now - kind.since >= self.interval:
                    if kind.suppressed:
                        self._say(kind, now)
                    del self.kinds[key]

    def _say(self, kind: _Kind, now: float) -> None:
        logging.getLogger(kind.logger).log(
            kind.level, "foxhunt ensemble serve: %d more like this in the last %.1f s (ensemble.serve.log_interval_s): %s",
            kind.suppressed, now - kind.since, kind.text.removeprefix("foxhunt ensemble serve: "), extra={self.SUMMARY: True})  # fmt: skip
        kind.suppressed = 0


class Guard:
    """Every client of the server bounded in count and time (module doc, "Clients are bounded"):
    the sockets open, those idle (no request in progress: the read timeout runs, the longest
    idle is closed for a new connection at the cap), the requests in progress, the body reads
    (cut short by a stop), and a count of each event (``GET /info``). It lives on the event
    loop's thread (a signal handler calls :meth:`stop_soon`)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: set = set()  # the protocol of each open socket
        self.idle: OrderedDict = OrderedDict()  # protocol -> None, idle longest first
        self.requests = 0  # requests in progress, GET /health not counted
        self.reads: set[asyncio.Future] = set()  # each body read waiting for its next chunk
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.counts: Counter = Counter()
        self.log = RateLimitedLog(limits.log_interval_s)
        detail = json.dumps(
            {"detail": f"request headers not complete within {limits.read_timeout_s:g} s (ensemble.serve.read_timeout_s)"}
        )
        self.header_timeout = _closing_response(408, "Request Timeout", detail)
        self.malformed = _closing_response(
            400,
            "Bad Request",
            json.dumps({"detail": "not an HTTP/1.1 request this server can read (its request line or headers)"}),
        )

    def event(self, kind: str, message: str, *args) -> None:
        """Count ``kind`` and log it (a warning, rate-limited per kind)."""
        self.counts[kind] += 1
        log.warning("foxhunt ensemble serve: " + message, *args)

    def admit(self, connection) -> bool:
        """A new socket: True when it may stay (the connection idle longest closed for it at the
        cap); False when every socket has a request in progress."""
        if len(self.open) >= self.limits.max_sockets:
            if not self.idle:
                self.event("refused", "connection cap: %d sockets open and none idle (ensemble.serve.max_connections + "
                                      "health_reserve): a new connection refused", len(self.open))  # fmt: skip
                return False
            oldest, _ = self.idle.popitem(last=False)
            self.open.discard(oldest)
            oldest.evict()
            self.event("evicted", "connection cap: %d sockets open (ensemble.serve.max_connections + health_reserve): "
                                  "the connection idle longest closed for a new one", self.limits.max_sockets)  # fmt: skip
        self.open.add(connection)
        return True

    def became_idle(self, connection) -> None:
        self.idle[connection] = None
        self.idle.move_to_end(connection)

    def became_busy(self, connection) -> None:
        self.idle.pop(connection, None)

    def lost(self, connection) -> None:
        self.open.discard(connection)
        self.idle.pop(connection, None)

    async def next_message(self, receive, seconds: float) -> dict:
        """The request's next ASGI message within ``seconds``; :class:`TimeoutError` when none
        came, or when the server stops meanwhile (then :attr:`stopping` is set)."""
        receiving = asyncio.ensure_future(receive())
        self.reads.add(receiving)
        try:
            await asyncio.wait({receiving}, timeout=0 if self.stopping else max(seconds, 0))
        except BaseException:  # the request itself cancelled (the end of the shutdown grace)
            receiving.cancel()
            raise
        finally:
            self.reads.discard(receiving)
        if receiving.done() and not receiving.cancelled():
            return receiving.result()
        receiving.cancel()
        raise TimeoutError

    def stop_soon(self) -> None:
        """From a signal handler: :meth:`stop` on the loop."""
        self.stopping = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop)

    def stop(self) -> None:
        """The server stops: every body read waiting ends now (its request is a 503)."""
        self.stopping = True
        for receiving in list(self.reads):
            receiving.cancel()

    def info(self) -> dict:
        return {"open": len(self.open), "idle": len(self.idle), "requests_in_progress": self.requests,
                "max_connections": self.limits.max_connections, "health_reserve": self.limits.health_reserve,
                "read_timeout_s": self.limits.read_timeout_s, "log_interval_s": self.limits.log_interval_s,
                "events": dict(self.counts)}  # fmt: skip

    async def flush_log(self) -> None:
        """Say the held-back log counts every ``log_interval_s`` (a task of the server's lifespan)."""
        while True:
            await asyncio.sleep(self.limits.log_interval_s)
            self.log.flush()


def _closing_response(status: int, reason: str, body: str) -> bytes:
    """A whole JSON response written straight to a socket that is then closed."""
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body.encode())}\r\n\r\n{body}").encode()  # fmt: skip


def guarded_protocol(guard: Guard) -> type:
    """uvicorn's h11 protocol with ``guard``'s bounds on each socket: admitted at the cap or
    refused, the read timeout while no request is in progress (bytes do not restart it: only
    complete request headers stop it), idle or busy for the guard."""

    class GuardedH11Protocol(H11Protocol):
        _read_timer: asyncio.TimerHandle | None = None
        _partial = False  # bytes of a request came since the read timeout started

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if guard.admit(self):
                self._wait_for_request()
            else:
                transport.close()

        def connection_lost(self, exc) -> None:
            self._stop_read_timer()
            guard.lost(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._partial = self._partial or self._read_timer is not None
            before = self.cycle
            super().data_received(data)
            self._check_request(before)

        def on_response_complete(self) -> None:
            before = self.cycle
            super().on_response_complete()
            if not self.transport.is_closing():
                self._wait_for_request()
                self._check_request(before)  # a pipelined request may have started

        def send_400_response(self, msg: str) -> None:
            """A request h11 cannot parse (not HTTP, a negative or 23-digit Content-Length): the
            server's one-line JSON 400, not uvicorn's plain text (found by a helper probing the
            server)."""
            guard.event("malformed", "a malformed HTTP request (%s): 400, closed", msg)
            self.transport.write(guard.malformed)
            self.transport.close()

        def evict(self) -> None:
            self._stop_read_timer()
            self.transport.close()

        def _wait_for_request(self) -> None:
            self._stop_read_timer()
            self._partial = False
            self._read_timer = self.loop.call_later(guard.limits.read_timeout_s, self._read_timed_out)
            guard.became_idle(self)

        def _check_request(self, before) -> None:
            if self.cycle is not None and self.cycle is not before and not self.cycle.response_complete:
                self._stop_read_timer()
                guard.became_busy(self)

        def _stop_read_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if self.transport.is_closing():
                return
            if self._partial:
                guard.event("header_timeout", "read timeout: a client sent part of a request but not all its headers within "
                                              "%g s (ensemble.serve.read_timeout_s): 408, closed", guard.limits.read_timeout_s)  # fmt: skip
                self.transport.write(guard.header_timeout)
            else:
                guard.counts["idle_closed"] += 1  # an idle keep-alive or a silent socket: closed, not worth a line
            self.transport.close()

    return GuardedH11Protocol


def guarded_app(app, guard: Guard):
    """``app`` behind the request cap: a request beyond ``max_connections`` (or during a stop)
    is a 503 and its connection closed, ``GET /health`` always passes; a request still running
    when uvicorn cancels it at the end of the shutdown grace is a 503, without a traceback."""
    limits = guard.limits

    async def asgi(scope, receive, send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        exempt = scope["path"] == HEALTH_PATH
        if not exempt and (guard.stopping or guard.requests >= limits.max_connections):
            if guard.stopping:
                detail = "the server is stopping"
            else:
                guard.event("busy", "connection cap: %d requests in progress (ensemble.serve.max_connections): a request "
                                    "answered 503", guard.requests)  # fmt: skip
                detail = (f"{guard.requests} requests in progress, at most {limits.max_connections} "
                          f"(ensemble.serve.max_connections); try again later")  # fmt: skip
            await _answer(send, 503, detail)
            return
        started = False

        async def sending(message) -> None:
            nonlocal started
            started = True
            await send(message)

        guard.requests += not exempt
        try:
            await app(scope, receive, sending)
        except asyncio.CancelledError:
            if not guard.stopping:
                raise
            guard.event("cancelled", "stopping: a request still running after ensemble.serve.shutdown_grace_s: 503")
            if not started:
                await _answer(
                    send,
                    503,
                    f"the server stopped before the answer (ensemble.serve.shutdown_grace_s={limits.shutdown_grace_s:g})",
                )
        finally:
            guard.requests -= not exempt

    return asgi


async def _answer(send, status: int, detail: str) -> None:
    """A JSON ``{"detail": ...}`` answer, then the connection is closed."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def build_app(service: EnsembleService, guard: Guard):
    """The Starlette app around ``service``, behind ``guard``'s request cap (:func:`guarded_app`)."""
    batcher = Batcher(service)
    limits = guard.limits

    def refuse(error: BadRequest) -> JSONResponse:
        headers = {"connection": "close"} if error.close else {}
        if error.retry_after_s is not None:
            headers["retry-after"] = str(error.retry_after_s)
        return JSONResponse({"detail": str(error)}, status_code=error.status, headers=headers or None)

    async def predict(request: Request):
        arrived, arrived_ns = time.monotonic(), time.perf_counter_ns()
        try:
            body = await _read_body(request, guard, arrived)
            symbol, bars = parse_request(_parse_json(body, request.headers.get("content-type", "")), limits.max_bars_per_request)
        except BadRequest as error:
            return refuse(error)
        except ClientGone:
            guard.event("client_gone", "a client closed its connection before its request's body was complete")
            return Response(status_code=400)  # nobody reads it
        parsed_ns = time.perf_counter_ns()
        pending = await batcher.submit(Pending(symbol, bars, arrived + limits.timeout_s))
        if pending.error is not None:
            return refuse(pending.error)
        timing = {"read_parse": (parsed_ns - arrived_ns) / 1e3, "queue": (pending.started_ns - parsed_ns) / 1e3,
                  "ensemble_batch": (pending.done_ns - pending.started_ns) / 1e3,
                  "handler": (time.perf_counter_ns() - arrived_ns) / 1e3}  # fmt: skip
        return JSONResponse({"symbol": symbol, "results": pending.results, "timing_us": timing})

    async def health(request: Request):
        return PlainTextResponse("ok")

    async def info(request: Request):
        await asyncio.get_running_loop().run_in_executor(batcher.pool, service.apply_swaps)
        return JSONResponse({**service.info(), "connections": guard.info()})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        guard.loop = asyncio.get_running_loop()
        await batcher.start()
        flushing = asyncio.create_task(guard.flush_log())
        try:
            yield
        finally:
            flushing.cancel()
            guard.log.flush(final=True)
            await batcher.stop()

    async def bug(request: Request, exc: Exception):  # a bug: one JSON line, the traceback in the log
        log.exception("foxhunt ensemble serve: %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {str(exc)[:200]}"}, status_code=500)

    async def refused(request: Request, exc: Exception):  # Starlette's own 404 and 405: JSON, as every refusal
        assert isinstance(exc, HTTPException)  # the handler of that class only
        return JSONResponse({"detail": f"{request.method} {request.url.path[:64]}: {exc.detail}"}, status_code=exc.status_code,
                            headers=exc.headers)  # fmt: skip

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route(HEALTH_PATH, health), Route("/info", info)],
                    lifespan=lifespan, exception_handlers={Exception: bug, HTTPException: refused})  # fmt: skip
    app.router.redirect_slashes = False  # /predict/ is a 404, not a redirect to a URL built from the client's Host header
    return guarded_app(app, guard)


async def _read_body(request, guard: Guard, arrived: float) -> bytes:
    """The request's body: at most ``max_body_bytes`` (413), no pause longer than
    ``read_timeout_s``, arriving at ``min_body_rate`` bytes/s on average from ``body_grace_s``
    after its headers (``arrived``, ``time.monotonic()``) on, and complete within ``timeout_s``
    of them (408); a 503 when the server stops meanwhile; :class:`ClientGone` when the client
    closed its connection. The rate bounds what a client dripping bytes costs the server: a
    request slot for about ``body_grace_s``, not ``timeout_s``."""
    limits = guard.limits
    limit = limits.max_body_bytes
    deadline = arrived + limits.timeout_s
    declared = request.headers.get("content-length")
    if declared is not None and "transfer-encoding" in request.headers:  # RFC 9112 6.3: a proxy may read the body otherwise
        raise BadRequest("body: both Content-Length and Transfer-Encoding: send one of them", 400, close=True)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"body: {int(declared)} bytes, at most {limit} (ensemble.serve.max_body_bytes)", 413, close=True)
    chunks, size = [], 0
    while True:
        now = time.monotonic()
        left = deadline - now
        behind = arrived + limits.body_grace_s + size / limits.min_body_rate - now  # until the body is too slow
        try:
            message = await guard.next_message(request.receive, min(limits.read_timeout_s, left, behind))
        except TimeoutError:
            if guard.stopping:
                guard.event("stopped_read", "stopping: a request whose body was still arriving answered 503")
                raise BadRequest(f"the server is stopping; {size} bytes of the body had come", 503, close=True) from None
            if behind < min(left, limits.read_timeout_s):  # the body fell below the rate first
                guard.event("slow_body", "read timeout: a request body arriving at under %d bytes/s "
                                         "(ensemble.serve.min_body_rate): 408, closed", limits.min_body_rate)  # fmt: skip
                raise BadRequest(f"body: {size} bytes in {time.monotonic() - arrived:.1f} s, under {limits.min_body_rate} "
                                 f"bytes/s after the first {limits.body_grace_s:g} s (ensemble.serve.min_body_rate)",
                                 408, close=True) from None  # fmt: skip
            if left <= limits.read_timeout_s:  # the whole request's deadline came first
                guard.event("request_timeout", "read timeout: a request body not complete %g s after its headers "
                                               "(ensemble.serve.timeout_s): 408, closed", limits.timeout_s)  # fmt: skip
                raise BadRequest(f"body: not complete {limits.timeout_s:g} s after the request's headers ({size} bytes came; "
                                 f"ensemble.serve.timeout_s)", 408, close=True) from None  # fmt: skip
            guard.event("body_timeout", "read timeout: a request body paused %g s (ensemble.serve.read_timeout_s): 408, closed",
                        limits.read_timeout_s)  # fmt: skip
            raise BadRequest(f"body: nothing more for {limits.read_timeout_s:g} s after {size} bytes "
                             f"(ensemble.serve.read_timeout_s)", 408, close=True) from None  # fmt: skip
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"body: more than {limit} bytes (ensemble.serve.max_body_bytes)", 413, close=True)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _parse_json(body: bytes, content_type: str) -> Any:
    kind = content_type.split(";")[0].strip().lower()
    if kind and kind not in JSON_TYPES:
        raise BadRequest(f"body: Content-Type {kind}, expected application/json")
    if not body:
        raise BadRequest("body: empty, expected a JSON object with symbol and bars")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body: not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except BadRequest:
        raise
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"body: not JSON ({str(exc)[:120]})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: with a key twice the last silently won, so a
    proxy or an audit reading the first saw another bar than the one scored."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise BadRequest(f"body: the key {_as_json(key)} appears twice in one object")
        found[key] = value
    return found


def _refuse_constant(name: str):
    raise BadRequest(f"body: {name} is not a JSON number")


class PortInUse(UserError):
    """The address the server is asked to listen on is taken (or cannot be bound)."""

    kind = "serve"


def check_address(host: str, port: int) -> None:
    """Raise :class:`PortInUse` (one line) when ``host:port`` cannot be bound now."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise PortInUse(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None


def run(service: EnsembleService, host: str, port: int) -> None:
    """Serve ``service`` until SIGTERM / Ctrl-C (blocks; module doc)."""
    limits = service.limits
    guard = Guard(limits)
    # uvicorn's keep-alive timeout closes an idle connection as the guard's read timeout does; its
    # listen backlog (listen_backlog, counted in reserve_descriptors) and h11's bound on a request's
    # header bytes (16 KiB) are kept; the requests in flight at a stop get shutdown_grace_s, then
    # uvicorn cancels them (guarded_app answers those 503)
    config = uvicorn.Config(build_app(service, guard), host=host, port=port, http=guarded_protocol(guard), ws="none",
                            log_level="warning", access_log=False, lifespan="on", backlog=listen_backlog(),
                            timeout_keep_alive=limits.read_timeout_s,  # type: ignore[arg-type]  # uvicorn types it int; a float is a float timeout (loop.call_later)
                            timeout_graceful_shutdown=int(math.ceil(limits.shutdown_grace_s)))  # fmt: skip

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # SIGTERM / SIGINT: bodies still arriving end now (503)
            super().handle_exit(sig, frame)
            guard.stop_soon()

    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "asyncio", log.name)]
    for logger in loggers:
        logger.addFilter(guard.log)
    # the ensemble, torch, numba and pandas are millions of objects that live as long as the server: a
    # full collection over them stalled every request ~0.6 s under connection churn (measured: GET
    # /health); frozen, they are out of the collector's generations, which then scan only what the
    # server makes while it serves
    gc.collect()
    gc.freeze()
    service.watch()
    # uvicorn shuts down gracefully on SIGTERM / SIGINT, then raises the signal again under the
    # handlers it found: these make that a return, so the stop exits 0 (a stop asked for is no failure)
    stopped = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        Server(config).run()
    finally:
        for sig, handler in stopped.items():
            signal.signal(sig, handler)
        service.stop_watching()
        for logger in loggers:
            logger.removeFilter(guard.log)
        gc.unfreeze()
