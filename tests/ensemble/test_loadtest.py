"""foxhunt.ensemble.loadtest against a scripted server on loopback (the real server under load:
test_serve.py): every answer is checked against the replay, so a wrong decision and an error are
each counted and named; the expected answers follow the replay's warm-up; the health wait gives up."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from foxhunt.ensemble.loadtest import expected_answers, run_load, wait_healthy

RECORD = SimpleNamespace(close=np.arange(8.0), warm_bars=2,
                         positions={"ensemble": np.array([0, 0, 1, 1, -1, 0, 1, 1]), "a": np.array([0, 0, 1, 1, -1, -1, 1, 0]),
                                    "b": np.array([0, 0, 1, 0, -1, 0, 1, 1])})  # fmt: skip
BARS = pd.DataFrame({"open": 1.0, "high": 1.0, "low": 1.0, "close": 1.0, "volume": 1.0},
                    index=pd.date_range("2024-03-12 15:00", periods=8, freq="1min", tz="UTC"))  # fmt: skip


def test_the_expected_answers_follow_the_replays_warm_up():
    answers = expected_answers(RECORD, ["a", "b"])
    assert answers[0] == {"warm": False, "position": 0, "members": {}}
    assert answers[5] == {"warm": True, "position": 0, "members": {"a": -1, "b": 0}}
    assert [a["position"] for a in answers] == RECORD.positions["ensemble"].tolist()


class Scripted(BaseHTTPRequestHandler):
    """Answers each bar as the replay did, except LOAD1's bar 3 (a wrong ensemble position) and
    LOAD2's bar 5 (HTTP 500)."""

    protocol_version = "HTTP/1.1"
    stamps = BARS.index.as_unit("ns").asi8.tolist()
    answers = expected_answers(RECORD, ["a", "b"])

    def do_POST(self):  # noqa: N802 (http.server's name)
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        i = self.stamps.index(request["bar"]["ts"])
        want = dict(self.answers[i])
        status = 500 if (request["symbol"], i) == ("LOAD2", 5) else 200
        if (request["symbol"], i) == ("LOAD1", 3):
            want["position"] = -want["position"] or 1
        body = json.dumps({"results": [{"warm": want["warm"], "position": want["position"],
                                        "members": {n: {"position": p} for n, p in want["members"].items()}}],
                           "timing_us": {"handler": 250.0, "ensemble_batch": 100.0}}).encode()  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_wrong_answer_and_an_error_are_each_counted_and_named(scripted):
    result = run_load(scripted, BARS, RECORD, ["a", "b"], clients=3)
    assert (result.requests, result.answered, result.errors, result.wrong) == (24, 23, 1, 1)
    assert result.latencies_ms.size == 24 and result.throughput > 0
    notes = "\n".join(result.first_errors)
    assert f"LOAD1 ts {BARS.index.as_unit('ns').asi8[3]}: got " in notes and "the replay {'warm': True, 'position': 1" in notes
    assert f"LOAD2 ts {BARS.index.as_unit('ns').asi8[5]}: HTTP 500" in notes
    np.testing.assert_allclose(result.server_ms["handler"], 0.25)  # the server's own figures, in ms
    assert "answered 23/24, errors 1, wrong 1" in result.text()


def test_the_health_wait_gives_up():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(TimeoutError, match="did not answer 200 within 1 s"):
        wait_healthy(url, 1.0)
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait()
    with pytest.raises(RuntimeError, match="the server exited with status 3 before it was healthy"):
        wait_healthy(url, 30.0, exited)
