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
import urllib.request
from pathlib import Path

import psutil
import pytest
from fleet_helpers import DATA, cli
from waiting import process_gone, wait_until

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


@pytest.fixture(scope="module")
def server(store_root):
    cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    port = _free_port()
    env = {**os.environ, "FOXHUNT_ROOT": str(store_root)}
    process = subprocess.Popen([sys.executable, "-m", "foxhunt.cli", "ensemble", "serve", "--port", str(port), "asset=es", *DATA],
                               cwd=store_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 240, process)
        yield url, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_eight_clients_get_the_replays_decisions(server, store_root):
    from hydra.utils import instantiate

    from foxhunt.build import compose_config
    from foxhunt.ensemble.fleet import fleet_engine, load_fleet
    from foxhunt.ensemble.replay import replay_bars

    url, _ = server
    cfg = compose_config(["asset=es", *DATA], root_dir=store_root, config_name="fleet")
    asset = instantiate(cfg.asset)
    bars = instantiate(cfg.data.source).load(asset).iloc[:120]
    with tempfile.TemporaryDirectory() as workdir:
        fleet = load_fleet(cfg, Path(workdir))
        record = replay_bars(fleet_engine(fleet, asset, cfg, origin="test"), bars)
    result = run_load(url, bars, record, [f.member.name for f in fleet], clients=8)
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
        ({**bar, "ts": "2024-01-02 15:02"}, "no time zone"),
        ({k: v for k, v in bar.items() if k != "volume"}, "missing volume"),
    ):
        status, body = _post(url, {"symbol": "BAD", "bars": [broken]})
        assert status == 400 and line in body["detail"], body
    status, body = _post(url, {"symbol": "no spaces allowed", "bar": bar})
    assert status == 400 and "symbol=" in body["detail"]
    status, body = _post(url, {"symbol": "BAD", "bars": [{**bar, "ts": "2024-01-02T15:01:00Z"}]})
    assert status == 200  # the stream took none of the bad bars


def test_sigterm_stops_every_process_of_the_server(server):
    url, process = server
    children = psutil.Process(process.pid).children(recursive=True)
    assert children  # LitServe's API server and inference worker
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) is not None
    for child in children:
        wait_until(lambda child=child: process_gone(child.pid), f"server process {child.pid} exited")
