"""The benchmark's entry point: run the configured sections, write ``benchmark.{json,md}``.

``scripts/benchmark.py`` calls :func:`main`; :func:`run` returns the report as a dict (what
the tests check). Sections whose peer library is missing are skipped with a note, never failed:
the peers are an optional extra (``pip install '.[bench]'``).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from foxhunt.bench import checkpoints, ensemble, latency, overhead, report, rl, roll, system, tft
from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import load_average, machine
from foxhunt.bench.settings import DEFAULT_SETTINGS, load_settings
from foxhunt.errors import debug_requested, reported
from foxhunt.runs.environment import root_dir

SECTION_MODULES = {
    "rl": rl,
    "tft": tft,
    "latency": latency,
    "overhead": overhead,
    "ensemble": ensemble,
    "system": system,
    "checkpoint": checkpoints,
    "roll": roll,
}


def run(
    settings: DictConfig,
    root: Path,
    command: str,
    quick: bool = False,
    settings_file: str | Path = DEFAULT_SETTINGS,
    log=print,
) -> dict:
    """Every section of ``settings.sections``; the report (see :mod:`foxhunt.bench.report`)."""
    started = datetime.now(timezone.utc)
    load_before = load_average()
    clock = time.perf_counter()
    ctx = BenchContext(settings=settings, root=Path(root).resolve(), log=log)
    rows: list[report.Row] = []
    notes: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    for section in settings.sections:
        section_started = time.perf_counter()
        section_rows, section_notes = SECTION_MODULES[section].run_section(ctx)
        rows += section_rows
        notes[section] = [*section_notes, f"section took {time.perf_counter() - section_started:.0f} s"]
        if not section_rows:
            skipped[section] = "; ".join(section_notes) or "no figures"
    return {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "seconds": time.perf_counter() - clock,
            "command": command,
            "quick": quick,
            "settings_file": str(settings_file),
            "machine": machine(),
            "load_before": load_before,
            "load_after": load_average(),
        },
        "rows": [row.to_dict() for row in rows],
        "notes": notes,
        "skipped": skipped,
        "settings": OmegaConf.to_container(settings, resolve=True),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/benchmark.py",
        description="foxhunt against its peers and the limit: RL throughput, TFT training, inference "
        "latency, framework overhead; writes benchmark.md and benchmark.json",
    )
    parser.add_argument("--quick", action="store_true", help="a short run of every section (settings' quick node)")
    parser.add_argument("--settings", default=None, help=f"settings file (default {DEFAULT_SETTINGS})")
    parser.add_argument("--root", default=None, help="folder of outputs/ (default $FOXHUNT_ROOT or the current one)")
    parser.add_argument(
        "--sections",
        default=None,
        help="comma-separated subset of rl,tft,latency,overhead,ensemble,system,checkpoint,roll "
        "(system: hours, checkpoint and roll: minutes; none of them in the default list)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting, e.g. --set repeats=3 --set threads=[1]",
    )
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.sections:
        overrides.append(f"sections=[{args.sections}]")

    root = Path(args.root).resolve() if args.root else root_dir()
    with reported(parser.prog, debug=debug_requested(argv)):  # a bad setting: one line, exit 2
        settings = load_settings(args.settings, quick=args.quick, overrides=overrides)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    command = shlex.join(["python", "scripts/benchmark.py", *(argv if argv is not None else sys.argv[1:])])
    result = run(
        settings,
        root,
        command,
        quick=args.quick,
        settings_file=args.settings or DEFAULT_SETTINGS,
        log=lambda line: print(f"[bench] {line}", file=sys.stderr, flush=True),
    )
    ctx = BenchContext(settings=settings, root=root)
    json_path, md_path = report.write(result, ctx.output_dir)
    print(report.markdown(result))
    print(f"wrote {md_path} and {json_path}")
    return 0
