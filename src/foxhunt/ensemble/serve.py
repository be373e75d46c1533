"""The fleet behind HTTP: ``foxhunt ensemble serve``.

One process: uvicorn serves a Starlette app, and the fleet runs in the same process on one
compute thread, so a request costs the fleet's own work plus parsing, never a hop to another
process. Requests that arrive while the fleet is busy wait in a queue; the compute thread takes
everything waiting (at most ``ensemble.serve.max_batch`` requests, one per symbol: a symbol's
bars stay in order) and steps all their streams at once (:meth:`foxhunt.ensemble.engine.StreamingEngine.step_many`:
one batched call per member), so eight clients on eight symbols cost about one fleet step, not
eight. Measured: ``scripts/load_test.py`` reports the in-process fleet beside the HTTP round
trip.

API (JSON, on ``127.0.0.1`` by default):

- ``POST /predict`` ``{"symbol": "ES", "bars": [{"ts": 1717200000000000000 | "2024-06-01T00:00:00Z",
  "open": ..., "high": ..., "low": ..., "close": ..., "volume": ...}, ...]}`` (or ``"bar": {...}``
  for one bar): the bars go, in order, into the symbol's own stream (features, members' states),
  and the answer is one result per bar: ``{"ts", "warm", "position"`` (the ensemble's),
  ``"members": {name: {"position", "signal"}}``, ``"latency_us"}`` (``signal`` is ``null`` for
  an agent and a forecaster not yet warm: the body is strict JSON, never ``NaN``), and
  ``timing_us``: where the request's time went in the server (``time.perf_counter_ns``): reading
  and parsing the body, waiting for the compute thread, its batch's fleet work, the whole handler.
- ``GET /health``: ``ok`` (the fleet is loaded before the server listens); ``GET /info``: the
  members (version, run, runtime, weights), the symbols, the limits, the bytes one symbol's
  stream holds (measured: every member's slot and the feature windows), the uptime.

Every request the server refuses is a 4xx with ``{"detail": one line naming the field and the
problem}``, never a 500: a body that is not JSON, not UTF-8 or not an object (400), over
``max_body_bytes`` (413), more bars than ``max_bars_per_request`` (400), a value out of range
(a price above the tick grid's exact range, a time outside 1970..2200, a 400-digit number: 400),
a bad bar (out of order, off the tick grid: 400; the bars before it in the request were applied,
it and those after it not), a symbol not allowed (403) or one too many (429, see below), and a
request still unanswered ``timeout_s`` after it arrived, queue time included (504: the bars
applied by then are said).

**Symbols are bounded.** ``ensemble.serve.symbols`` (a list) admits only those; at most
``max_symbols`` streams live at once, a stream idle for ``idle_evict_s`` seconds is dropped
(its slots reused); a new symbol beyond the limit is a 429. A stream is created only once its
first bar passed the checks, so a refused request holds no memory.

**Stopping.** SIGTERM or Ctrl-C: uvicorn stops accepting, the requests in flight are answered
(within ``shutdown_grace_s``), the process exits 0 without a traceback, and the folder the fleet
was read into is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import signal
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.errors import UserError

log = logging.getLogger(__name__)
SYMBOL = re.compile(r"[A-Za-z0-9._:-]{1,32}")  # the whole symbol (fullmatch: re's $ matches before a trailing newline)
BAR_KEYS = ("ts", "open", "high", "low", "close", "volume")
JSON_TYPES = ("application/json",)


class BadRequest(ValueError):
    """A request the server refuses (one line); ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_ts(value: Any) -> int:
    """A bar start as UTC nanoseconds: an integer (ns since the epoch) or an ISO-8601 string
    with a zone (``Z`` or an offset). Range checks are the stream's (1970..2200)."""
    import pandas as pd

    if isinstance(value, bool):
        raise BadRequest(f"ts={value!r}: expected integer nanoseconds or an ISO-8601 time with a zone")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            stamp = pd.Timestamp(value)
            nanoseconds = None if stamp.tzinfo is None else int(stamp.tz_convert("UTC").as_unit("ns").value)
        except (ValueError, OverflowError, TypeError):  # pandas' OutOfBoundsDatetime is a ValueError
            raise BadRequest(f"ts={value[:64]!r}: not an ISO-8601 time between 1677 and 2262") from None
        if nanoseconds is None:
            raise BadRequest(f"ts={value[:64]!r}: no time zone (add Z for UTC)")
        return nanoseconds
    raise BadRequest(f"ts={str(value)[:64]!r}: expected integer nanoseconds or an ISO-8601 time with a zone")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{where}={str(value)[:64]!r}: expected a number")
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
        raise BadRequest(f"symbol={str(symbol)[:64]!r}: expected 1-32 letters, digits or ._:-")
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
    return symbol, parsed


def result_json(result) -> dict:
    return {
        "ts": int(result.ts_ns),
        "warm": result.warm,
        "position": int(result.position),
        "members": {
            name: {"position": int(d.position), "signal": None if d.signal is None or not math.isfinite(d.signal) else float(d.signal)}
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
    shutdown_grace_s: float

    @classmethod
    def from_config(cls, node, timeout_s: float | None = None) -> Limits:
        values = {k: node[k] for k in cls.__dataclass_fields__}
        values["symbols"] = list(values["symbols"]) if values["symbols"] is not None else None
        if timeout_s is not None:
            values["timeout_s"] = float(timeout_s)
        return cls(**values)


@dataclass
class Pending:
    """A request waiting for the fleet: its bars, when it must be answered by, its answer."""

    symbol: str
    bars: list[tuple]
    deadline: float  # time.monotonic()
    results: list[dict] = field(default_factory=list)
    error: BadRequest | None = None
    started_ns: int = 0  # perf_counter_ns when the compute thread took it (its batch began)
    done_ns: int = 0  # ... and when its batch was answered


class FleetService:
    """The fleet with one stream per symbol (the part of the server that knows no HTTP)."""

    def __init__(self, cfg, workdir: Path, limits: Limits) -> None:
        from hydra.utils import instantiate

        from foxhunt.ensemble.fleet import fleet_engine, load_fleet

        self.cfg = cfg
        self.limits = limits
        self.asset = instantiate(cfg.asset)
        self.fleet = load_fleet(cfg, workdir)
        self.engine = fleet_engine(self.fleet, self.asset, cfg, origin="symbol")
        self.streams: OrderedDict[str, Any] = OrderedDict()  # symbol -> Stream, least recently used first
        self.started = time.monotonic()
        self.stream_bytes = self.engine.stream_bytes()
        self.answered = 0

    def info(self) -> dict:
        return {
            "asset": str(self.asset.key), "rule": str(self.cfg.ensemble.rule),
            "members": {f.member.name: {"version": f.version, "run_id": f.run_id, "runtime": f.member.runtime,
                                        "weights": f.member.weights, "trained_precision": f.precision} for f in self.fleet},
            "symbols": len(self.streams), "max_symbols": self.limits.max_symbols,
            "allowed_symbols": self.limits.symbols, "idle_evict_s": self.limits.idle_evict_s,
            "max_bars_per_request": self.limits.max_bars_per_request, "max_body_bytes": self.limits.max_body_bytes,
            "timeout_s": self.limits.timeout_s,
            "stream_bytes": self.stream_bytes,
            "stream_bytes_method": "one symbol's stream: every member's state slot (numpy nbytes) and its feature windows (sys.getsizeof)",
            "uptime_s": round(time.monotonic() - self.started, 3), "requests_answered": self.answered,
        }  # fmt: skip

    def _evict_idle(self, now: float) -> None:
        idle = self.limits.idle_evict_s
        if idle is None:
            return
        while self.streams:
            symbol, stream = next(iter(self.streams.items()))
            if now - stream.seen_monotonic < idle:
                break
            self.engine.close_stream(self.streams.pop(symbol))

    def _stream(self, symbol: str, first_bar: tuple):
        """The symbol's stream; a new one only if the symbol is admitted and its first bar passes."""
        stream = self.streams.get(symbol)
        if stream is not None:
            self.streams.move_to_end(symbol)
            return stream
        if self.limits.symbols is not None and symbol not in self.limits.symbols:
            raise BadRequest(f"symbol={symbol!r}: not served here (ensemble.serve.symbols)", 403)
        if len(self.streams) >= self.limits.max_symbols:
            raise BadRequest(f"symbol={symbol!r}: {len(self.streams)} symbols are streaming, at most "
                             f"{self.limits.max_symbols} (ensemble.serve.max_symbols); try again later", 429)  # fmt: skip
        stream = self.engine.open_stream(symbol)
        try:
            self.engine.check(stream, first_bar)
        except Exception:
            self.engine.close_stream(stream)
            raise
        self.streams[symbol] = stream
        return stream

    def answer(self, batch: list[Pending]) -> None:
        """Step the bars of ``batch`` (distinct symbols), one bar of each request per round."""
        from foxhunt.data.errors import BarDataError

        now = time.monotonic()
        began = time.perf_counter_ns()
        for pending in batch:
            pending.started_ns = began
        self._evict_idle(now)
        active: list[tuple[Pending, Any]] = []
        for pending in batch:
            try:
                active.append((pending, self._stream(pending.symbol, pending.bars[0])))
            except BarDataError as exc:
                pending.error = BadRequest(f"bars[0]: {exc} (0 earlier bar(s) of this request applied)")
            except BadRequest as exc:
                pending.error = exc
        step = 0
        while active:
            now = time.monotonic()
            late = [(p, s) for p, s in active if now > p.deadline]
            for pending, _ in late:
                pending.error = BadRequest(f"request timed out after {self.limits.timeout_s:g} s (ensemble.serve.timeout_s), "
                                           f"{len(pending.results)} of {len(pending.bars)} bar(s) applied", 504)  # fmt: skip
            active = [(p, s) for p, s in active if now <= p.deadline]
            if not active:
                break
            results = self.engine.step_many([(stream, pending.bars[step]) for pending, stream in active])
            still = []
            for (pending, stream), result in zip(active, results):
                if isinstance(result, BarDataError):
                    pending.error = BadRequest(f"bars[{step}]: {result} ({step} earlier bar(s) of this request applied)")
                    continue
                pending.results.append(result_json(result))
                if step + 1 < len(pending.bars):
                    still.append((pending, stream))
            active = still
            step += 1
        self.answered += len(batch)
        ended = time.perf_counter_ns()
        for pending in batch:
            pending.done_ns = ended


class Batcher:
    """Requests queue here; one compute thread answers everything waiting at once (module doc)."""

    def __init__(self, service: FleetService) -> None:
        self.service = service
        self.queue: asyncio.Queue | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foxhunt-fleet")
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.pool.shutdown(wait=True)

    async def submit(self, pending: Pending) -> Pending:
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((pending, done))
        return await done

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        held: list = []  # a request whose symbol is in the batch already waits for the next one
        while True:
            items = held or [await self.queue.get()]
            held = []
            while not self.queue.empty() and len(items) < self.service.limits.max_batch:
                items.append(self.queue.get_nowait())
            batch, symbols = [], set()
            for item in items:
                if item[0].symbol in symbols:
                    held.append(item)
                else:
                    symbols.add(item[0].symbol)
                    batch.append(item)
            try:
                await loop.run_in_executor(self.pool, self.service.answer, [p for p, _ in batch])
            except Exception as exc:  # a bug: every request of the batch gets it, the server goes on
                for pending, _ in batch:
                    pending.error = pending.error or BadRequest(f"internal error: {type(exc).__name__}: {exc}", 500)
            for pending, done in batch:
                if not done.done():
                    done.set_result(pending)


def build_app(service: FleetService):
    """The Starlette app around ``service``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    batcher = Batcher(service)
    limits = service.limits

    def refuse(error: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=error.status)

    async def predict(request: Request):
        arrived, arrived_ns = time.monotonic(), time.perf_counter_ns()
        try:
            body = await _read_body(request, limits.max_body_bytes)
            symbol, bars = parse_request(_parse_json(body, request.headers.get("content-type", "")), limits.max_bars_per_request)
        except BadRequest as error:
            return refuse(error)
        parsed_ns = time.perf_counter_ns()
        pending = await batcher.submit(Pending(symbol, bars, arrived + limits.timeout_s))
        if pending.error is not None:
            return refuse(pending.error)
        timing = {"read_parse": (parsed_ns - arrived_ns) / 1e3, "queue": (pending.started_ns - parsed_ns) / 1e3,
                  "fleet_batch": (pending.done_ns - pending.started_ns) / 1e3,
                  "handler": (time.perf_counter_ns() - arrived_ns) / 1e3}  # fmt: skip
        return JSONResponse({"symbol": symbol, "results": pending.results, "timing_us": timing})

    async def health(request: Request):
        return PlainTextResponse("ok")

    async def info(request: Request):
        return JSONResponse(service.info())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    async def bug(request: Request, exc: Exception):  # a bug: one JSON line, the traceback in the log
        log.exception("foxhunt ensemble serve: %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {str(exc)[:200]}"}, status_code=500)

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/health", health), Route("/info", info)],
                     lifespan=lifespan, exception_handlers={Exception: bug})  # fmt: skip


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"body: {int(declared)} bytes, at most {limit} (ensemble.serve.max_body_bytes)", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"body: more than {limit} bytes (ensemble.serve.max_body_bytes)", 413)
        chunks.append(chunk)
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
        return json.loads(text, parse_constant=_refuse_constant)
    except BadRequest:
        raise
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"body: not JSON ({str(exc)[:120]})") from None


def _refuse_constant(name: str):
    raise BadRequest(f"body: {name} is not a JSON number")


class PortInUse(UserError):
    """The address the server is asked to listen on is taken (or cannot be bound)."""

    kind = "serve"


def check_address(host: str, port: int) -> None:
    """Raise :class:`PortInUse` (one line) when ``host:port`` cannot be bound now."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise PortInUse(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None


def run(service: FleetService, host: str, port: int) -> None:
    """Serve ``service`` until SIGTERM / Ctrl-C (blocks; module doc)."""
    import uvicorn

    config = uvicorn.Config(build_app(service), host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=int(math.ceil(service.limits.shutdown_grace_s)), lifespan="on")  # fmt: skip
    # uvicorn shuts down gracefully on SIGTERM / SIGINT, then raises the signal again under the
    # handlers it found: these make that a return, so the stop exits 0 (a stop asked for is no failure)
    stopped = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvicorn.Server(config).run()
    finally:
        for sig, handler in stopped.items():
            signal.signal(sig, handler)
