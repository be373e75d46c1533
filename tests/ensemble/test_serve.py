"""`foxhunt ensemble serve` end to end: a real server process on loopback, 8 concurrent clients
whose every answer equals the in-process replay, bad bars answered 400 with their line, and
SIGTERM ending every process of the server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from fleet_helpers import DATA, cli

from foxhunt.ensemble.loadtest import run_load, wait_healthy


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/predict", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


SERVE = ["ensemble.serve.max_symbols=12", "ensemble.serve.max_bars_per_request=300", "ensemble.serve.max_body_bytes=200000"]


def _raw(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/predict", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _get(url: str, path: str) -> dict:
    with urllib.request.urlopen(f"{url}{path}", timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def server(store_root):
    cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    port = _free_port()
    env = {**os.environ, "FOXHUNT_ROOT": str(store_root), "TMPDIR": str(store_root / "tmp")}
    (store_root / "tmp").mkdir(exist_ok=True)
    process = subprocess.Popen([sys.executable, "-m", "foxhunt.cli", "ensemble", "serve", "--port", str(port), "asset=es",
                                *DATA, *SERVE], cwd=store_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 240, process)
        yield url, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_eight_clients_get_the_replays_decisions(server, store_root):
    from hydra.utils import instantiate

    from foxhunt.training.parts import compose_config
    from foxhunt.ensemble.fleet import fleet_engine, load_fleet
    from foxhunt.ensemble.replay import replay_bars

    url, _ = server
    cfg = compose_config(["asset=es", *DATA], root_dir=store_root, config_name="fleet")
    asset = instantiate(cfg.asset)
    bars = instantiate(cfg.data.source).load(asset).iloc[:120]
    with tempfile.TemporaryDirectory() as workdir:
        fleet = load_fleet(cfg, Path(workdir))
        replayed = replay_bars(fleet_engine(fleet, asset, cfg, origin="test"), bars)
    result = run_load(url, bars, replayed, [f.member.name for f in fleet], clients=8)
    assert (result.answered, result.errors, result.wrong) == (960, 0, 0), result.text()
    assert result.latencies_ms.size == 960 and result.throughput > 0


def test_bad_bars_are_400_with_their_line_and_the_stream_goes_on(server):
    url, _ = server
    bar = {"ts": "2024-01-02T15:00:00Z", "open": 4800.0, "high": 4800.5, "low": 4799.75, "close": 4800.25, "volume": 5}
    status, body = _post(url, {"symbol": "BAD", "bars": [bar]})
    assert status == 200 and body["results"][0]["warm"] is False
    for broken, line in (
        ({**bar, "ts": "2024-01-02T14:59:00Z"}, "out of order"),
        ({**bar, "ts": "2024-01-02T15:01:00Z", "close": 4800.1}, "off the tick grid of es"),
        ({**bar, "ts": "2024-01-02T15:01:00Z", "low": 1e-9}, "low=1e-09 is below one tick (0.25)"),
        ({**bar, "ts": "2024-01-02 15:02"}, "no time zone"),
        ({k: v for k, v in bar.items() if k != "volume"}, "missing volume"),
    ):
        status, body = _post(url, {"symbol": "BAD", "bars": [broken]})
        assert status == 400 and line in body["detail"], body
    status, body = _post(url, {"symbol": "no spaces allowed", "bar": bar})
    assert status == 400 and "symbol=" in body["detail"]
    status, body = _post(url, {"symbol": "BAD", "bars": [{**bar, "ts": "2024-01-02T15:01:00Z"}]})
    assert status == 200  # the stream took none of the bad bars


BAR = {"ts": "2024-01-02T15:00:00Z", "open": 4800.0, "high": 4800.5, "low": 4799.75, "close": 4800.25, "volume": 5}


@pytest.mark.parametrize(
    ("body", "content_type", "status", "line"),
    [
        (b"{not json", "application/json", 400, "body: not JSON"),
        (b"", "application/json", 400, "body: empty"),
        (b"\xff\xfe{}", "application/json", 400, "body: not UTF-8"),
        (b"symbol=ES&close=1", "application/x-www-form-urlencoded", 400, "Content-Type application/x-www-form-urlencoded"),
        (b"[1, 2]", "application/json", 400, "body: expected a JSON object"),
        (b'{"symbol": "H1", "bar": {"ts": 1, "open": NaN, "high": 1, "low": 1, "close": 1, "volume": 1}}', "application/json", 400,
         "NaN is not a JSON number"),
        (json.dumps({"symbol": "H2", "bar": {**BAR, "close": 1e308}}).encode(), "application/json", 400, "close=1e+308 is above"),
        (json.dumps({"symbol": "H3", "bar": {**BAR, "open": 10**400}}).encode(), "application/json", 400, "a number too large for a float"),
        (json.dumps({"symbol": "H4", "bar": {**BAR, "ts": "9999-01-01T00:00:00Z"}}).encode(), "application/json", 400, "not an ISO-8601 time"),
        (json.dumps({"symbol": "H5", "bar": {**BAR, "ts": 10**30}}).encode(), "application/json", 400, "outside the bar times"),
        (json.dumps({"symbol": "H6", "bars": [BAR] * 301}).encode(), "application/json", 400, "301 bars in one request, at most 300"),
        (b"{" + b'"pad": "' + b"x" * 250_000 + b'"}', "application/json", 413, "at most 200000 (ensemble.serve.max_body_bytes)"),
        # a price within float noise of tick 0 passed as "positive and on the grid" (and snapped to 0.0 in training)
        (json.dumps({"symbol": "H7", "bar": {**BAR, "open": 1e-9, "high": 1e-9, "low": 1e-9, "close": 1e-9}}).encode(), "application/json", 400,
         "open=1e-09 is below one tick (0.25): a price is at least one tick"),
        (json.dumps({"symbol": "H8", "bar": {**BAR, "low": 1e-9}}).encode(), "application/json", 400, "low=1e-09 is below one tick (0.25)"),
        # re's $ matches before a trailing newline: "H9\n" passed the symbol rule and opened a stream of its own
        (json.dumps({"symbol": "H9\n", "bar": BAR}).encode(), "application/json", 400, "symbol='H9\\n': expected 1-32 letters"),
        (json.dumps({"symbol": "H9\r\n", "bar": BAR}).encode(), "application/json", 400, "symbol='H9\\r\\n': expected 1-32 letters"),
    ],
)  # fmt: skip
def test_every_hostile_body_is_a_4xx_with_its_line_and_holds_nothing(server, body, content_type, status, line):
    url, _ = server
    before = _get(url, "/info")["symbols"]
    got, answer = _raw(url, body, content_type)
    assert got == status and line in answer["detail"], answer
    assert "\n" not in answer["detail"]
    assert _get(url, "/info")["symbols"] == before  # a refused request creates no stream


def test_a_huge_timestamp_does_not_break_the_symbols_later_bars(server):
    url, _ = server
    assert _post(url, {"symbol": "LATER", "bar": BAR})[0] == 200
    assert _post(url, {"symbol": "LATER", "bar": {**BAR, "ts": 10**30}})[0] == 400
    assert _post(url, {"symbol": "LATER", "bar": {**BAR, "ts": "2024-01-02T15:01:00Z"}})[0] == 200


def test_symbols_are_bounded_and_info_lists_the_fleet(server):
    url, _ = server
    info = _get(url, "/info")
    assert set(info["members"]) == {"foxhunt-dqn-es", "foxhunt-ppo-es", "foxhunt-mamba2-es", "foxhunt-tft-es"}
    assert all({"version", "run_id", "runtime", "weights"} <= set(m) for m in info["members"].values())
    assert info["stream_bytes"] > 0 and "nbytes" in info["stream_bytes_method"] and info["uptime_s"] > 0
    statuses = [_post(url, {"symbol": f"MANY{i}", "bar": BAR})[0] for i in range(14)]
    assert statuses.count(429) >= 1 and _get(url, "/info")["symbols"] <= 12
    status, body = _post(url, {"symbol": "MANY99", "bar": BAR})
    assert status == 429 and "ensemble.serve.max_symbols" in body["detail"]


def test_sigterm_answers_what_is_in_flight_and_exits_0_without_a_traceback(server, store_root):
    url, process = server
    import threading

    bars = [{**BAR, "ts": 1704207660_000_000_000 + i * 60_000_000_000} for i in range(200)]  # after MANY0's 15:00 bar
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(result=_post(url, {"symbol": "MANY0", "bars": bars})))
    thread.start()
    time.sleep(0.3)  # the request is in flight
    process.send_signal(signal.SIGTERM)
    thread.join(timeout=60)
    assert answer["result"][0] == 200 and len(answer["result"][1]["results"]) == 200
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out[-2000:]
    assert b"Traceback" not in out
    assert not list((store_root / "tmp").glob("foxhunt-serve-*"))  # the fleet's copy removed
