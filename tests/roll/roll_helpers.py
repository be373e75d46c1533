"""Helpers of the roll tests: synthetic ES bars written as a folder of daily CSV files (the
source that grows: a new file a day), a small ensemble trained and registered on them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ensemble"))

from ensemble_helpers import FAST, SMALL, cli, client  # noqa: E402,F401

from configs import synthetic_source

CSV = ["data=csv", "data.source.bar_label=start"]
TRAIN_FAST = [item for item in FAST if not item.startswith("data.source.days")]
# a step: 300 new bars at least, the newest 300 scored, the challenger on the 3,000 before a purge of 60
ROLL = ["roll.min_new_bars=300", "roll.eval_bars=300", "roll.window_bars=3000", "roll.purge_bars=60"]


def synthetic_bars(days: int, seed: int = 7, **pattern) -> pd.DataFrame:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    asset = instantiate(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "asset" / "es.yaml"))
    return synthetic_source(days=days, seed=seed, start="2024-01-01", **pattern).load(asset)


def utc_dates(bars: pd.DataFrame) -> list[str]:
    return sorted(set(np.datetime_as_string(bars.index.as_unit("ns").asi8.astype("datetime64[ns]"), unit="D")))


def write_days(bars: pd.DataFrame, folder: Path, dates: list[str]) -> None:
    """One CSV file per UTC date (``<date>.csv``), as a vendor's daily export."""
    folder.mkdir(parents=True, exist_ok=True)
    days = np.datetime_as_string(bars.index.as_unit("ns").asi8.astype("datetime64[ns]"), unit="D")
    for date in dates:
        chosen = bars[days == date]
        stamps = np.datetime_as_string(chosen.index.as_unit("ns").asi8.astype("datetime64[ns]"), unit="s")
        frame = pd.DataFrame(
            {
                "timestamp_utc": [f"{s}Z" for s in stamps],
                **{c: chosen[c].to_numpy() for c in ("open", "high", "low", "close", "volume")},
            }
        )
        frame.to_csv(folder / f"{date}.csv", index=False)


def train_and_register(root: Path, folder: Path, models=("dqn",), seed: int = 42) -> None:
    from configs import compose_train_config
    from foxhunt.training.cell import train

    for model in models:
        train(compose_train_config([f"model={model}", *CSV, f"data.source.path={folder}", *TRAIN_FAST, *SMALL[model],
                                    f"seed={seed}", f"paths.output_dir={root / 'outputs' / model}"], root))  # fmt: skip
    registered = cli(root, "ensemble", "register", "asset=es", f"ensemble.models=[{','.join(models)}]", "ensemble.gate=none",
                     *CSV, f"data.source.path={folder}")  # fmt: skip
    assert registered.exit_code == 0, registered.output
