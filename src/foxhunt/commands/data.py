"""``foxhunt data show [OVERRIDES...] [--json] [--png PATH]``: what a data config yields, without
training (:mod:`foxhunt.data.overview`).

Overrides are those of ``foxhunt-train``: ``data=lean data.source.path=... asset=es
data.source.adjust=ratio``, ``evaluation.protocol=walk_forward``. The text report lists the
source files, the first and last bar, bars per contract and per session, the roll schedule
with the reason of each roll, the tick-grid check, the session calendar with its holidays and
early closes in range, the gaps that are not closed-market time and the split boundaries;
``--json`` prints the same as one JSON object for scripts; the PNG (default
``outputs/data/<asset>-continuous.png`` under the project root; ``--png <folder>`` puts it in
that folder) draws the raw and adjusted close with the rolls marked. Bars too few for the
splits are reported as such, with everything else: an inspection shows what is there, however
few bars. Exit 0, or 2 with one line on a bad override or data file.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from foxhunt.errors import EXIT_USER_ERROR, FolderError, debug_requested, reported

# Lazy imports: (a) Hydra, the schema and the data room, once data show runs: --help and completion start without them

data_app = typer.Typer(help="The data a config yields: bars, rolls, calendar, gaps and splits.", no_args_is_help=True)

OVERRIDES = typer.Argument(None, help="Hydra overrides as for foxhunt-train: data=lean data.source.path=... asset=es")
MAX_ROWS = 40  # sessions and gaps listed in the text report (all of them in --json)
MAX_DATES = 12  # holidays and early closes listed in the text report


@data_app.callback()
def _group() -> None:
    """The data a config yields."""


@data_app.command()
def show(
    overrides: list[str] | None = OVERRIDES,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report."),
    png: Path | None = typer.Option(
        None, "--png", help="Where to write the price chart (default outputs/data/<asset>-continuous.png)."
    ),
    min_gap: int = typer.Option(5, "--min-gap", min=1, help="List runs of at least this many open-market minutes without a bar."),
) -> None:
    """Load the bars of a data config and report what they hold (no training)."""
    with reported("foxhunt data show", debug=debug_requested(), exit_code=EXIT_USER_ERROR):
        from hydra.utils import instantiate

        from foxhunt.config.compose import compose_config
        from foxhunt.config.schema import validate
        from foxhunt.data.overview import describe, load_bars, plot_continuous
        from foxhunt.data.splits import WalkForwardConfig

        cfg = compose_config(list(overrides or []))
        validate(cfg)
        asset = instantiate(cfg.asset)
        source = instantiate(cfg.data.source)
        walk_forward = (
            WalkForwardConfig.from_config(cfg.evaluation.walk_forward) if cfg.evaluation.protocol == "walk_forward" else None
        )
        bars, rolls = load_bars(source, asset)
        summary = describe(source, asset, bars, rolls, cfg.data.features, cfg.data.split, walk_forward,
                           min_gap_minutes=min_gap, holdout=cfg.evaluation.get("holdout") or 0.0)  # fmt: skip
        chart = f"{asset.key}-continuous.png"
        target = png or Path(cfg.paths.root_dir) / "outputs" / "data" / chart
        if target.is_dir():  # --png <folder>: the chart goes inside it
            target = target / chart
        elif target.suffix.lower() != ".png":  # matplotlib wrote NOTES.png for NOTES (the path said: NOTES) and a
            # traceback for out.csv: 'Format csv is not supported' (found by a helper)
            raise FolderError(f"--png {target}: the chart is a PNG file: name one ending in .png, or a folder")
        try:
            summary["png"] = str(plot_continuous(bars, rolls, asset, summary["adjust"], target))
        except OSError as exc:  # a path under a file, or one that cannot be written
            raise FolderError(f"--png {target}: the chart cannot be written there ({exc.strerror or exc})") from None
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
        return
    typer.echo("\n".join(render(summary)))


def _dates(items: list[str]) -> str:
    if not items:
        return "none"
    shown = ", ".join(items[:MAX_DATES])
    return shown + (f", ... {len(items) - MAX_DATES} more (--json lists all)" if len(items) > MAX_DATES else "")


def render(s: dict) -> list[str]:
    """The text report of a :func:`foxhunt.data.overview.describe` summary."""
    lines = [f"{s['asset']} bars from {s['source']}: {s['bars']:,} bars, {s['first_bar']} .. {s['last_bar']}"]
    if s["files"]:
        lines.append(f"files ({len(s['files'])}): " + ", ".join(Path(f).name for f in s["files"][:8])
                     + (" ..." if len(s["files"]) > 8 else ""))  # fmt: skip
    if s["roll"] is not None:
        lines.append(f"roll: {s['roll']}  (the contract of a session is decided before it opens)")
    lines.append("bars per contract: " + ", ".join(f"{c} {n:,}" for c, n in s["bars_per_contract"].items()))
    lines.append("")
    lines.append(f"{'session':<11} {'contract':<9} {'bars':>6}  first bar .. last bar (UTC)")
    for row in s["sessions"][:MAX_ROWS]:
        lines.append(
            f"{row['session']:<11} {row['contract']:<9} {row['bars']:>6}  {row['first_bar'][:16]} .. {row['last_bar'][:16]}"
        )
    if len(s["sessions"]) > MAX_ROWS:
        lines.append(f"... {len(s['sessions']) - MAX_ROWS} more sessions (--json lists all)")
    lines.append("")
    lines.append(f"roll schedule ({len(s['rolls'])} roll(s), adjust={s['adjust']}):")
    for r in s["rolls"]:
        lines.append(f"  {r['session']}  {r['from_contract']} -> {r['to_contract']}  at {r['first_bar'][:16]}: "
                     f"out at {r['from_price']:g}, in at {r['roll_price']:g} (gap {r['gap']:+g}); {r['reason']}")  # fmt: skip
    grid = s["tick_grid"]
    verdict = (
        "all on the grid" if grid["off_grid"] == 0 else f"{grid['off_grid']:,} off the grid, first at {grid['first_off_grid']}"
    )
    lines.append(
        f"tick grid {grid['tick']:g}: {grid['raw_closes']:,} raw closes, {verdict} (each contract's OHLC checked on load)"
    )
    cal = s["calendar"]
    lines.append(f"calendar: {cal['name']}")
    lines.append(f"  holidays in range ({len(cal['holidays'])}): " + _dates(cal["holidays"]))
    lines.append(f"  early closes in range ({len(cal['early_closes'])}): "
                 + _dates([f"{d['date']} {d['close']}" for d in cal["early_closes"]]))  # fmt: skip
    lines.append(f"gaps of {s['min_gap_minutes']}+ open-market minutes without a bar ({len(s['gaps'])}; "
                 "closed-market time is not a gap):")  # fmt: skip
    for g in s["gaps"][:MAX_ROWS]:
        closed = f" (and {g['closed_minutes_inside']:,} closed)" if g["closed_minutes_inside"] else ""
        lines.append(f"  {g['start'][:16]} .. {g['end'][:16]}: {g['open_minutes_missing']:,} open minute(s){closed}")
    if len(s["gaps"]) > MAX_ROWS:
        lines.append(f"  ... {len(s['gaps']) - MAX_ROWS} more (--json lists all)")
    splits = s["splits"]
    lines.append(f"splits ({splits['protocol']}, after the {splits['warmup_bars']}-bar feature warm-up):")
    if "error" in splits:
        lines.append(f"  not formed: {splits['error']}")
    names = ("train", "val", "test", "holdout")
    blocks = [] if "error" in splits else [("", {k: v for k, v in splits.items() if k in names})] if splits["protocol"] == "single" else [
        (f"fold {f['fold']} ", {k: f[k] for k in names if k in f}) for f in splits["folds"]]  # fmt: skip
    for prefix, parts in blocks:
        for name, extent in parts.items():
            span = f"{extent['first_bar']} .. {extent['last_bar']}" if extent.get("rows") else "empty"
            lines.append(f"  {prefix}{name:<5} {extent['rows']:>8,} bars  {span}")
    lines.append(f"chart: {s['png']}")
    return lines
