"""The fleet behind HTTP: ``foxhunt ensemble serve`` (LitServe).

LitServe is the server because it is Lightning's own: a ``LitAPI`` (setup, decode, predict,
encode) run by uvicorn, with a health endpoint that answers 200 only once ``setup`` (here:
loading the fleet) has finished, request timeouts, and graceful shutdown on SIGTERM. MLflow
users have the other path for free: every registered member is a ``pyfunc`` model, so
``mlflow models serve -m models:/foxhunt-tft-es@champion`` serves one member (stateless: each
request carries the bars it is decided on, see :mod:`foxhunt.ensemble.pyfunc`).

API (JSON, on ``127.0.0.1`` by default):

- ``POST /predict`` ``{"symbol": "ES", "bars": [{"ts": 1717200000000000000 | "2024-06-01T00:00:00Z",
  "open": ..., "high": ..., "low": ..., "close": ..., "volume": ...}, ...]}`` (or ``"bar": {...}``
  for one bar): the bars go, in order, into the symbol's own stream (features, members'
  states; created on the symbol's first bar), and the answer is one result per bar:
  ``{"ts", "warm", "position"`` (the ensemble's), ``"members": {name: {"position", "signal"}}``,
  ``"latency_us"}``. A bad bar (out of order, off the tick grid, ...) is a 400 with its one
  line; the bars before it in the request were applied, the bad one and those after it not.
- ``GET /health``: 200 ``ok`` once the fleet is loaded; ``GET /info``: the members.

One worker process holds the fleet and answers requests one at a time, so each symbol's stream
sees its bars in the order they were accepted.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import litserve as ls
import pandas as pd

SYMBOL = re.compile(r"^[A-Za-z0-9._:-]{1,32}$")
BAR_KEYS = ("ts", "open", "high", "low", "close", "volume")


class BadRequest(ValueError):
    """A request the server refuses with 400 (one line)."""


def parse_ts(value: Any) -> int:
    """A bar start as UTC nanoseconds: an integer (ns since the epoch) or an ISO-8601 string
    with a zone (``Z`` or an offset)."""
    if isinstance(value, bool):
        raise BadRequest(f"ts={value!r}: expected integer nanoseconds or an ISO-8601 time with a zone")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            stamp = pd.Timestamp(value)
        except ValueError:
            raise BadRequest(f"ts={value!r}: not an ISO-8601 time") from None
        if stamp.tzinfo is None:
            raise BadRequest(f"ts={value!r}: no time zone (add Z for UTC)")
        return int(stamp.tz_convert("UTC").value)
    raise BadRequest(f"ts={value!r}: expected integer nanoseconds or an ISO-8601 time with a zone")


def parse_request(request: Any) -> tuple[str, list[tuple]]:
    """(symbol, bars as (ts_ns, open, high, low, close, volume)) of a request body."""
    if not isinstance(request, dict):
        raise BadRequest("body: expected a JSON object with symbol and bars")
    symbol = request.get("symbol")
    if not isinstance(symbol, str) or not SYMBOL.match(symbol):
        raise BadRequest(f"symbol={symbol!r}: expected 1-32 letters, digits or ._:-")
    bars = request.get("bars", [request["bar"]] if "bar" in request else None)
    if not isinstance(bars, list) or not bars:
        raise BadRequest("bars: expected a non-empty list of bars (or bar: one bar)")
    parsed = []
    for i, bar in enumerate(bars):
        if not isinstance(bar, dict):
            raise BadRequest(f"bars[{i}]: expected an object with {', '.join(BAR_KEYS)}")
        missing = [k for k in BAR_KEYS if k not in bar]
        if missing:
            raise BadRequest(f"bars[{i}]: missing {', '.join(missing)}")
        values = []
        for key in BAR_KEYS[1:]:
            value = bar[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BadRequest(f"bars[{i}].{key}={value!r}: expected a number")
            values.append(float(value))
        parsed.append((parse_ts(bar["ts"]), *values))
    return symbol, parsed


def result_json(result) -> dict:
    return {
        "ts": int(result.ts_ns),
        "warm": result.warm,
        "position": int(result.position),
        "members": {
            name: {"position": int(d.position), "signal": None if d.signal is None else float(d.signal)}
            for name, d in result.decisions.items()
        },
        "latency_us": result.total_ns / 1e3,
    }


class FleetService:
    """The fleet with one stream per symbol (the part of the server that knows no HTTP)."""

    def __init__(self, cfg, workdir: Path) -> None:
        from hydra.utils import instantiate

        from foxhunt.ensemble.fleet import fleet_engine, load_fleet

        self.cfg = cfg
        self.asset = instantiate(cfg.asset)
        self.fleet = load_fleet(cfg, workdir)
        self._engine = lambda symbol: fleet_engine(
            [f.fork() for f in self.fleet], self.asset, cfg, origin=f"symbol {symbol}"
        )  # fmt: skip
        self.streams: dict[str, Any] = {}

    def info(self) -> dict:
        return {
            "asset": str(self.asset.key), "rule": str(self.cfg.ensemble.rule),
            "members": {f.member.name: {"version": f.version, "run_id": f.run_id, "runtime": f.member.runtime}
                        for f in self.fleet},
            "symbols": sorted(self.streams),
        }  # fmt: skip

    def answer(self, symbol: str, bars: list[tuple]) -> list[dict]:
        from foxhunt.data.errors import BarDataError

        engine = self.streams.get(symbol)
        if engine is None:
            engine = self.streams[symbol] = self._engine(symbol)
        results = []
        for i, bar in enumerate(bars):
            try:
                results.append(result_json(engine.step(*bar)))
            except BarDataError as exc:
                raise BadRequest(f"bars[{i}]: {exc} ({i} earlier bar(s) of this request applied)") from None
        return results


class FleetAPI(ls.LitAPI):
    """LitServe's side: the fleet is loaded in the worker (``setup``), from the config's YAML."""

    def __init__(self, config_yaml: str) -> None:
        super().__init__()
        self.config_yaml = config_yaml
        self.service: FleetService | None = None

    def setup(self, device) -> None:
        from omegaconf import OmegaConf

        cfg = OmegaConf.create(self.config_yaml)
        self.service = FleetService(cfg, Path(tempfile.mkdtemp(prefix="foxhunt-serve-")))

    def decode_request(self, request):  # no annotation: LitServe reads the JSON body
        try:
            return parse_request(request)
        except BadRequest as exc:
            return exc

    def predict(self, x):
        from fastapi import HTTPException

        if isinstance(x, BadRequest):
            raise HTTPException(status_code=400, detail=str(x))
        symbol, bars = x
        try:
            return {"symbol": symbol, "results": self.service.answer(symbol, bars)}
        except BadRequest as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    def encode_response(self, output):
        return output


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def serve(cfg, host: str, port: int, timeout_s: float) -> None:
    """Run the server until SIGTERM / Ctrl-C (blocks). SIGTERM takes LitServe's Ctrl-C path, its
    graceful shutdown of the API server and the worker (its default would end this process only,
    leaving both running)."""
    import signal

    from omegaconf import OmegaConf

    from foxhunt.config.schema import resolved_config

    yaml = OmegaConf.to_yaml(OmegaConf.create(resolved_config(cfg)))
    server = ls.LitServer(FleetAPI(yaml), accelerator="cuda" if str(cfg.ensemble.device).startswith("cuda") else "cpu",
                          devices=1, workers_per_device=1, timeout=timeout_s)  # fmt: skip
    signal.signal(signal.SIGTERM, _interrupt)
    server.run(host=host, port=port, generate_client_file=False, num_api_servers=1, log_level="warning")
