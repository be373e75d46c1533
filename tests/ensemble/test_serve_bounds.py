"""The server's client bounds in-process (no ensemble): the rate-limited log, the connection cap's
admission (the connection idle longest closed for a new one), a body read cut by its timeout or
a stop, the file-descriptor reserve, the settings read from conf/, and a long request stepped in
slices. The server end to end is tests/ensemble/test_serve.py."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from foxhunt.ensemble.serve import EnsembleService, Guard, Limits, Pending, RateLimitedLog, reserve_descriptors
from foxhunt.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def limits(**over) -> Limits:
    values = {"max_symbols": 4, "symbols": None, "idle_evict_s": None, "max_bars_per_request": 10, "max_body_bytes": 1000, "resend_bars": 4, "slice_bars": 8, "min_body_rate": 16384, "body_grace_s": 1.0,
              "max_batch": 4, "timeout_s": 5.0, "read_timeout_s": 1.0, "max_connections": 2, "health_reserve": 1,
              "log_interval_s": 10.0, "shutdown_grace_s": 1.0, **over}  # fmt: skip
    return Limits(**values)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def logged():
    """(logger, its lines, the filter on a fake clock with a 10 s interval)."""
    clock = Clock()
    rate = RateLimitedLog(10.0, clock=clock)
    logger = logging.getLogger("foxhunt.tests.serve_bounds")
    lines = Lines()
    logger.addHandler(lines)
    logger.addFilter(rate)
    logger.propagate = False
    try:
        yield logger, lines.lines, rate, clock
    finally:
        logger.removeHandler(lines)
        logger.removeFilter(rate)


def test_a_flood_is_one_line_per_kind_per_interval_then_its_count(logged):
    logger, lines, rate, clock = logged
    for _ in range(1000):  # asyncio's line when accept() finds no file descriptor left, with its traceback
        logger.error("socket.accept() out of system resource", exc_info=OSError(24, "Too many open files"))
        logger.warning("foxhunt ensemble serve: connection cap: %d sockets open", 20)
    assert lines == ["socket.accept() out of system resource: OSError: [Errno 24] Too many open files",
                     "foxhunt ensemble serve: connection cap: 20 sockets open"]  # fmt: skip
    clock.now = 9.9
    rate.flush()
    assert len(lines) == 2  # the interval is not over
    clock.now = 10.0
    rate.flush()
    assert lines[2:] == [
        "foxhunt ensemble serve: 999 more like this in the last 10.0 s (ensemble.serve.log_interval_s): "
        "socket.accept() out of system resource: OSError: [Errno 24] Too many open files",
        "foxhunt ensemble serve: 999 more like this in the last 10.0 s (ensemble.serve.log_interval_s): connection cap: 20 sockets open",
    ]
    logger.warning("foxhunt ensemble serve: connection cap: %d sockets open", 21)  # a new interval: said again
    assert lines[-1] == "foxhunt ensemble serve: connection cap: 21 sockets open"
    assert not any("Traceback" in line for line in lines)


def test_a_bug_keeps_its_traceback_once_per_interval_and_a_stop_says_every_count(logged):
    logger, lines, rate, clock = logged
    for _ in range(3):
        try:
            raise ValueError("a bug")
        except ValueError:
            logger.exception("foxhunt ensemble serve: POST /predict")
    assert len(lines) == 1 and "Traceback" in lines[0] and "ValueError: a bug" in lines[0]
    clock.now = 1.0
    rate.flush(final=True)  # the server stops: the counts are said though the interval is not over
    assert lines[1] == "foxhunt ensemble serve: 2 more like this in the last 1.0 s (ensemble.serve.log_interval_s): POST /predict"
    assert rate.kinds == {}


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 3.0)), max_size=200))
def test_every_event_is_said_or_counted_and_a_kind_passes_at_most_once_per_interval(events):
    clock = Clock()
    rate = RateLimitedLog(1.0, clock=clock)
    logger = logging.getLogger("foxhunt.tests.serve_bounds.property")
    lines = Lines()  # the counts said (when a kind's next interval begins, and at the stop)
    logger.addHandler(lines)
    logger.propagate = False
    passed: dict[int, list[float]] = {}
    try:
        for kind, step in events:
            clock.now += step
            record = logging.LogRecord(
                logger.name, logging.WARNING, __file__, 1, f"kind {kind}", None, None
            )  # a kind: a template
            if rate.filter(record):
                passed.setdefault(kind, []).append(clock.now)
        rate.flush(final=True)
    finally:
        logger.removeHandler(lines)
    counted: dict[int, int] = {}
    for line in lines.lines:  # "foxhunt ensemble serve: N more like this in the last S s (...): kind K"
        kind, count = int(line.rsplit(" ", 1)[1]), int(line.split(" more like this")[0].rsplit(" ", 1)[1])
        counted[kind] = counted.get(kind, 0) + count
    for kind in {k for k, _ in events}:
        times = passed.get(kind, [])
        assert all(b - a >= 1.0 for a, b in zip(times, times[1:])), times  # at most one line per interval
        assert len(times) + counted.get(kind, 0) == sum(1 for k, _ in events if k == kind)  # none lost


class Connection:
    """A socket as the guard sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True

    def __repr__(self) -> str:
        return self.name


def test_at_the_cap_a_new_connection_closes_the_one_idle_longest_and_none_idle_refuses_it():
    guard = Guard(limits(max_connections=2, health_reserve=1))  # 3 sockets at most
    a, b, c, d, e, f = (Connection(n) for n in "abcdef")
    for conn in (a, b, c):
        assert guard.admit(conn)
        guard.became_idle(conn)
    guard.became_busy(b)  # b's request is in progress: never evicted
    guard.became_idle(a)  # a answered again: idle from now, after c
    assert guard.admit(d) and c.evicted and not a.evicted and not b.evicted
    guard.became_idle(d)
    assert guard.admit(e) and a.evicted and not d.evicted
    guard.became_busy(d)
    guard.became_busy(e)
    assert not guard.admit(f) and not f.evicted  # every socket has a request in progress
    assert guard.open == {b, d, e} and guard.counts == {"evicted": 2, "refused": 1}
    guard.lost(b)
    assert guard.admit(f)
    assert guard.info()["open"] == 3 and guard.info()["events"] == {"evicted": 2, "refused": 1}


def test_a_body_read_ends_at_its_timeout_or_at_once_when_the_server_stops():
    async def never() -> dict:
        await asyncio.sleep(3600)
        return {}

    async def scenario():
        guard = Guard(limits())
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(TimeoutError):
            await guard.next_message(never, 0.2)
        waited = loop.time() - began
        assert 0.19 <= waited < 1.0 and not guard.stopping and not guard.reads
        assert await guard.next_message(lambda: asyncio.sleep(0, result={"type": "http.request"}), 0.2) == {
            "type": "http.request"
        }
        reading = asyncio.ensure_future(guard.next_message(never, 60))
        await asyncio.sleep(0.05)
        began = loop.time()
        guard.stop()
        with pytest.raises(TimeoutError):
            await reading
        assert loop.time() - began < 0.5 and guard.stopping
        with pytest.raises(TimeoutError):  # once stopping, a read does not wait
            await guard.next_message(never, 60)

    asyncio.run(scenario())


def test_the_file_limit_is_raised_to_what_the_limits_need_or_a_one_line_config_error(monkeypatch):
    import resource

    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1 << 20))
    monkeypatch.setattr(resource, "setrlimit", lambda which, values: calls.append(values))
    need = reserve_descriptors(limits(max_connections=3000, health_reserve=16))
    assert need > 3016 and calls == [(need, 1 << 20)]
    calls.clear()
    monkeypatch.setattr(resource, "getrlimit", lambda which: (100_000, 1 << 20))
    assert reserve_descriptors(limits(max_connections=3000, health_reserve=16)) == 100_000 and not calls  # enough already
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 2048))
    with pytest.raises(ConfigError) as caught:
        reserve_descriptors(limits(max_connections=3000, health_reserve=16))
    message = str(caught.value)
    assert message.startswith("ensemble.serve.max_connections=3000: ") and "ulimit -Hn" in message and "\n" not in message


def test_the_server_settings_come_from_conf():
    node = OmegaConf.load(REPO / "conf" / "ensemble" / "default.yaml").serve
    read = Limits.from_config(node)
    assert (read.read_timeout_s, read.max_connections, read.health_reserve, read.log_interval_s) == (
        node.read_timeout_s, node.max_connections, node.health_reserve, node.log_interval_s)  # fmt: skip
    assert read.max_sockets == node.max_connections + node.health_reserve


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timeout", "nan"], "ensemble.serve.timeout_s=nan: "), (["--timeout", "-1"], "ensemble.serve.timeout_s=-1.0: "),
        (["--timeout", "1e9"], "ensemble.serve.timeout_s=1000000000.0: "), (["--port", "70000"], "--port 70000: must be 0..65535"),
        (["--port", "-1"], "--port -1: must be 0..65535"),
        # a device this machine lacks: a 157-line traceback from the first member's .to() (any ensemble command)
        (["ensemble.device=cuda:999"], "config error: ensemble.device=cuda:999: this machine has no such CUDA device"),
    ],
)  # fmt: skip
def test_serve_options_out_of_range_are_one_line_before_anything_loads(tmp_path, args, message):
    """--timeout bypassed the schema (nan answered 200 with no bar applied, -1 a 408 for every
    request) and --port 70000 was an OverflowError traceback (found by a helper probing serve)."""
    from typer.testing import CliRunner

    from foxhunt.cli import app

    result = CliRunner().invoke(app, ["ensemble", "serve", "asset=es", *args], env={"FOXHUNT_ROOT": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output


class _Engine:
    """The engine's part the service drives: streams, their check and a batched step (a bar's
    answer is its own start), and which streams were closed."""

    def __init__(self) -> None:
        self.closed: list = []
        self.batches: list[list[str]] = []

    def open_stream(self, symbol: str):
        return SimpleNamespace(symbol=symbol, last_bar_ns=None, seen_monotonic=time.monotonic(), features_warm=False)

    def check(self, stream, bar) -> None:
        assert stream not in self.closed, f"{stream.symbol}: stepped after it was closed"

    def close_stream(self, stream) -> None:
        self.closed.append(stream)

    def step_many(self, items):
        self.batches.append([stream.symbol for stream, _ in items])
        for stream, bar in items:
            self.check(stream, bar)
            stream.last_bar_ns, stream.seen_monotonic = bar[0], time.monotonic()
        return [SimpleNamespace(ts_ns=bar[0], warm=False, position=0, decisions={}, total_ns=0) for _, bar in items]


def _service(**over) -> EnsembleService:
    service = object.__new__(EnsembleService)  # the HTTP-free part, without loading an ensemble
    service.limits, service.engine, service.watcher = limits(**over), _Engine(), None
    service.streams, service.answers, service.continuing = OrderedDict(), {}, set()
    service.cold_evicted = service.answered = 0
    return service


def test_a_long_request_goes_on_in_slices_and_its_stream_is_never_closed_under_it():
    """A request of 10 bars at slice_bars=4 takes three batches; a live bar of another symbol
    sent meanwhile is answered in the batch it joins; the long request's stream, idle by a tiny
    idle_evict_s between two slices, is not closed under it (it was: the engine freed its slots
    while the request went on stepping them)."""
    service = _service(slice_bars=4, idle_evict_s=1e-9, max_bars_per_request=10, timeout_s=60.0)
    deadline = time.monotonic() + 60
    long = Pending("LONG", [(i, 1.0, 1.0, 1.0, 1.0, 1.0) for i in range(10)], deadline)
    assert service.answer([long]) == [long] and len(long.results) == 4
    time.sleep(0.01)  # idle for longer than idle_evict_s
    live = Pending("LIVE", [(100, 1.0, 1.0, 1.0, 1.0, 1.0)], deadline)
    assert service.answer([long, live]) == [long]
    assert len(live.results) == 1 and live.done_ns > 0 and len(long.results) == 8
    assert service.answer([long]) == [] and [r["ts"] for r in long.results] == list(range(10))
    assert [s.symbol for s in service.engine.closed] == ["LIVE"]  # idle after its bar; LONG only once answered
    assert service.answered == 2 and service.continuing == set()
    assert service.engine.batches[:5] == [["LONG"]] * 4 + [["LONG", "LIVE"]]


def test_a_swap_of_two_families_logs_both_under_the_rate_limit():
    """The roll promoted DQN and PPO together: the swap log said one (the second line had the
    first's template and was held back by the rate limit); /info named both."""
    from types import SimpleNamespace

    found = [SimpleNamespace(name=name, version="2", member=SimpleNamespace(weights="fp32"), inputs=None, value=None)
             for name in ("foxhunt-dqn-es", "foxhunt-ppo-es")]  # fmt: skip
    watcher = SimpleNamespace(take=lambda: found, swapped=lambda f: None, refused=lambda f, why: None)
    service = EnsembleService.__new__(EnsembleService)
    service.members = [SimpleNamespace(name=f.name, version="1") for f in found]
    service.engine = SimpleNamespace(swap=lambda *args: 5)
    service.streams, service.swaps, service.continuing = {}, [], set()
    logger = logging.getLogger("foxhunt.ensemble.serve")
    rate, lines = RateLimitedLog(10.0, clock=Clock()), Lines()
    logger.addFilter(rate)
    logger.addHandler(lines)
    try:
        service._swap(watcher)
    finally:
        logger.removeFilter(rate)
        logger.removeHandler(lines)
    assert [line.split(" v1 ")[0] for line in lines.lines] == [
        "foxhunt ensemble serve: swapped foxhunt-dqn-es",
        "foxhunt ensemble serve: swapped foxhunt-ppo-es",
    ]
    assert len(service.swaps) == 2


def test_a_swap_waits_until_no_request_is_part_answered():
    """A 10-bar request answered in slices of 4: a version loaded meanwhile was swapped in between
    two slices, so the response's first bars were decided by the old members and the rest by the
    new ones, unsaid (found by a helper probing the roll). The swap waits for the request's end."""
    service = _service(slice_bars=4, max_bars_per_request=10, timeout_s=60.0)
    long = Pending("LONG", [(i, 1.0, 1.0, 1.0, 1.0, 1.0) for i in range(10)], time.monotonic() + 60)
    looked: list[int] = []  # the bars of the request answered when the swap looked at the watcher
    service.watcher = SimpleNamespace(take=lambda: looked.append(len(long.results)) or [], has_ready=lambda: True)
    while service.answer([long]):
        pass
    service.apply_swaps()  # between batches, as /info does
    assert looked == [0, 10]


def test_overlapping_requests_do_not_keep_a_swap_out():
    """Requests of two symbols, each sent while the other was part-answered: the swap, waiting for
    no request to be part-answered, never came (one look in 201 batches; found reviewing the
    change). While a swap waits, new requests wait for it: it goes in within a request's slices."""
    service = _service(slice_bars=4, max_bars_per_request=10, timeout_s=60.0)
    ready = [True]
    looked: list[int] = []

    def take():
        looked.append(len(batches))
        ready[0] = False
        return []

    service.watcher = SimpleNamespace(take=take, has_ready=lambda: ready[0])
    batches: list[list[str]] = []
    deadline = time.monotonic() + 60
    going: list[Pending] = []
    for i in range(12):  # a new 8-bar request of A or B joins every batch
        symbol = "AB"[i % 2]
        if all(p.symbol != symbol for p in going):
            going.append(Pending(symbol, [(1000 * i + j, 1.0, 1.0, 1.0, 1.0, 1.0) for j in range(8)], deadline))
        ready[0] = ready[0] or i == 3  # a version loaded while A's request is part-answered
        batches.append([p.symbol for p in going])
        going = service.answer(going)
    assert len(looked) >= 2 and looked[1] <= 6, looked  # the loaded version went in within a request's two slices
