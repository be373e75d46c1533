"""Every bad input: one line on stderr naming the problem, a non-zero exit, no traceback, and
nothing already in the store or on disk changed.

The battery calls the entry functions in this process (``foxhunt.train.main`` with its command
line, the ``foxhunt`` Typer app), so each case costs a config composition, not an interpreter
start; two cases run the real ``foxhunt-train`` to prove the same from a shell. One store and
one set of bad files are shared by the module.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from configs import synthetic_source
from foxhunt.config.families import family_names
from foxhunt.errors import EXIT_USER_ERROR
from train_entry import run_foxhunt_train

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
REAL_6E = REAL / "6e_minute" / "6EH4_1min_bars_20240101_20240131.csv.gz"
REAL_DBN_1M = REAL / "databento" / "GLBX.MDP3.test_data.ohlcv-1m.dbn.zst"
REAL_DBN_1H = REAL / "databento" / "GLBX.MDP3.test_data.ohlcv-1h.dbn.zst"
REAL_LEAN = REAL / "es_lean_minute" / "minute_es_20131007_trade.zip"
HEADER = "timestamp_utc,open,high,low,close,volume\n"
SMOKE = ["trainer=smoke", "evaluation.plot_equity=false"]


class Evil:  # a pickled object of this class is what weights_only=True refuses
    pass


# ----------------------------------------------------------------------------- the bad files
def _bad_files(folder: Path) -> dict[str, Path]:
    import databento_dbn as dbn
    import torch

    from foxhunt.data.sources.databento import write_ohlcv_1m

    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}

    def text(name: str, body: str) -> None:
        files[name] = folder / name
        files[name].write_text(body)

    def raw(name: str, body: bytes) -> None:
        files[name] = folder / name
        files[name].write_bytes(body)

    text("empty.csv", HEADER)
    text("no_volume.csv", "timestamp_utc,open,high,low,close\n2024-01-02 00:01:00,100.0,100.25,99.75,100.0\n")
    text(
        "high_below_low.csv",
        HEADER + "2024-01-02 00:01:00,100.0,100.25,99.75,100.0,5\n2024-01-02 00:02:00,100.0,99.75,100.0,100.0,5\n",
    )
    text("off_tick.csv", HEADER + "2024-01-02 00:01:00,100.1,100.25,99.75,100.0,5\n")
    gz = REAL_6E.read_bytes()
    raw("cut.csv.gz", gz[: len(gz) // 2])
    raw("crc.csv.gz", gz[:-8] + bytes(8))
    dbn_zst = REAL_DBN_1M.read_bytes()
    raw("cut.dbn.zst", dbn_zst[: len(dbn_zst) - 5])
    flipped = bytearray(dbn_zst)
    flipped[150] ^= 0xFF
    raw("corrupt.dbn.zst", bytes(flipped))
    decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
    decoder.write(dbn_zst)
    decoded = decoder.decode()
    plain = decoded[0].encode() + b"".join(bytes(r) for r in decoded[1:])
    raw("last_record_cut.dbn", plain[:-20])

    bars = synthetic_source(days=2, seed=1).load(_asset("es"))
    files["other_dataset.dbn.zst"] = write_ohlcv_1m(bars, folder / "other_dataset.dbn.zst", "ESH4", 7, dataset="XCME.ITCH")
    lean = REAL_LEAN.read_bytes()
    raw("minute_es_20131007_cut_trade.zip", lean[: len(lean) // 2])
    with zipfile.ZipFile(REAL_LEAN) as archive:
        member = archive.namelist()[0]
        info = archive.getinfo(member)
    damaged = bytearray(lean)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start + 200, start + 260):
        damaged[i] ^= 0x5A
    raw("minute_es_20131007_damaged_trade.zip", bytes(damaged))

    # checkpoints: the config's own model, stamped or not, of another family, shape or precision
    from configs import compose_train_config
    from foxhunt.training.parts import build_model

    def checkpoint(name: str, overrides: list[str], stamp: dict | None, extra: dict | None = None) -> None:
        model = build_model(compose_train_config(overrides, folder / "compose"))
        state = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), "global_step": 0, **(extra or {})}
        if stamp is not None:
            state["foxhunt"] = {"format": 1, "module": "foxhunt.models.dqn.DQNAgent", "precision": "fp32", **stamp}
        files[name] = folder / name
        torch.save(state, files[name])

    checkpoint("foxhunt.ckpt", ["model=dqn"], {"model": "dqn"})
    checkpoint("lightning_only.ckpt", ["model=dqn"], None)
    checkpoint("ppo.ckpt", ["model=ppo"], {"model": "ppo"})
    checkpoint("small.ckpt", ["model=dqn", "model.module.hidden_sizes=[64,64]"], {"model": "dqn"})
    checkpoint("int8.ckpt", ["model=dqn"], {"model": "dqn", "precision": "int8"})
    checkpoint("evil.ckpt", ["model=dqn"], {"model": "dqn"}, {"callback": Evil()})
    whole = files["foxhunt.ckpt"].read_bytes()
    raw("cut.ckpt", whole[: len(whole) // 2])
    text("text_store.db", "this is not a database\n")
    return files


def _asset(key: str):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "asset" / f"{key}.yaml"))


@dataclass
class Battery:
    root: Path
    files: dict[str, Path]
    uri: str


@pytest.fixture(scope="module")
def battery(tmp_path_factory) -> Battery:
    if not REAL.is_dir():
        pytest.skip(f"real data folder {REAL} is absent")
    root = tmp_path_factory.mktemp("battery")
    files = _bad_files(root / "inputs")
    from foxhunt.runs.environment import store_uri
    from foxhunt.runs.store import RunStore

    uri = store_uri(root)
    store = RunStore(uri)  # one FINISHED run already in the store: no bad input may touch it
    run_id = store.create(store.ensure_experiment("foxhunt"), "dqn-es-fp32", {"model": "dqn"})
    store.log_metrics(run_id, {"test/sharpe": 1.5}, step=3)
    store.end(run_id, "FINISHED")
    return Battery(root, files, uri)


def _snapshot(battery: Battery) -> tuple:
    """Every run of the store (its status, tags, params, metrics) and every input file's digest."""
    from foxhunt.runs.store import RunStore

    runs = {r.run_id: (r.status, dict(r.tags), dict(r.params), {k: m.value for k, m in r.metrics.items()})
            for r in RunStore(battery.uri).search("foxhunt")}  # fmt: skip
    inputs = battery.root / "inputs"
    digests = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in battery.files.items()}
    digests["files in inputs/"] = sorted(str(p.relative_to(inputs)) for p in inputs.rglob("*"))  # none added
    return runs, digests


# ----------------------------------------------------------------------------- the cases
# (id, command-line arguments with {file} placeholders, what the one line must contain)
TRAIN_CASES = [
    # config
    # checked by the callback only: a traceback after the run began (found by a helper)
    (
        "on-breach",
        ["callbacks.memory_budget.on_breach=explode"],
        "config error: callbacks.memory_budget.on_breach='explode': Input should be 'warn', 'stop' or 'fail'",
    ),
    # in range [1, ...] but no backtest has one bar: a traceback after training (found by a helper)
    ("max-bars", ["evaluation.max_bars=1"], "config error: evaluation.max_bars=1: Input should be greater than or equal to 2"),
    (
        "horizon",
        ["model=tft", "model.window.horizon=60"],
        "config error: model.window.horizon=60: must be < model.window.seq_len (50)",
    ),
    (
        "unknown-option",
        ["model=nope"],
        f"config error: In 'train': Could not find 'model/nope' Available options in 'model': {', '.join(sorted(family_names()))}",
    ),
    # a model hyperparameter: its family's definition (foxhunt.config.model_schemas), before anything is built
    (
        "model-range",
        ["model=ppo", "model.module.gamma=1.0"],
        "config error: model.module.gamma=1.0: must be a number >= 0 and < 1",
    ),
    (
        "model-relation",
        ["model=tft", "model.module.num_heads=3"],
        "config error: model.module.num_heads=3: must divide model.module.hidden_size (256)",
    ),
    ("model-key", ["+model.module.hidden_sise=64"], "config error: model.module.hidden_sise: not a parameter of DQNAgent"),
    ("unknown-key", ["learning_rate=3"], "config error: Could not override 'learning_rate'"),
    (
        "bad-override",
        ["model.module.lr=[1,"],
        "config error: override 'model.module.lr=[1,': no viable alternative at input '[1,'",
    ),
    ("no-path", ["data=csv"], "config error: data.source.path: missing (required; set it on the command line"),
    (
        "bar-label",
        ["data=csv", "data.source.path={empty.csv}", "data.source.bar_label=middle"],
        "config error: data.source.bar_label='middle': must be one of start, close",
    ),
    ("resume-no-store", ["resume=true", "logger=none"], "config error: resume=True: needs logger.enabled=true"),
    (
        "folds-too-many",
        ["evaluation.protocol=walk_forward", "evaluation.walk_forward.folds=6"],
        "config error: evaluation.walk_forward.folds=6: train + folds x (val + test) = 1.25 of the bars: must be <= 1",
    ),
    (
        "folds-too-few-bars",
        [
            "data=csv",
            "asset=6e",
            f"data.source.path={REAL_6E}",
            "evaluation.protocol=walk_forward",
            "evaluation.walk_forward.purge_bars=100000",
        ],
        "data error: evaluation.walk_forward: 4 folds need",
    ),
    # csv
    (
        "csv-empty",
        ["data=csv", "data.source.path={empty.csv}"],
        "data error: {empty.csv}: no bars (the file has a header but no rows)",
    ),
    ("csv-column", ["data=csv", "data.source.path={no_volume.csv}"], "data error: {no_volume.csv}: missing column(s) volume"),
    (
        "csv-high-low",
        ["data=csv", "data.source.path={high_below_low.csv}"],
        "data error: {high_below_low.csv}: line 3 (2024-01-02T00:01:00+00:00): high=99.75 < low=100.0",
    ),
    (
        "csv-off-tick",
        ["data=csv", "data.source.path={off_tick.csv}"],
        "data error: {off_tick.csv}: line 2 (2024-01-02T00:00:00+00:00): field 'open'=100.1 is off the 0.25 tick grid",
    ),
    (
        "csv-missing",
        ["data=csv", "data.source.path={inputs}/nope.csv"],
        "data error: {inputs}/nope.csv: file not found (OHLCV CSV files)",
    ),
    (
        "gzip-cut",
        ["data=csv", "asset=6e", "data.source.path={cut.csv.gz}"],
        "data error: {cut.csv.gz}: truncated: the compressed data ends before its end-of-stream marker",
    ),
    (
        "gzip-crc",
        ["data=csv", "asset=6e", "data.source.path={crc.csv.gz}"],
        "data error: {crc.csv.gz}: corrupt compressed data (CRC check failed",
    ),
    # databento
    (
        "dbn-cut",
        ["data=databento", "data.source.path={cut.dbn.zst}"],
        "data error: {cut.dbn.zst}: truncated: the zstd data ends inside a frame",
    ),
    (
        "dbn-record-cut",
        ["data=databento", "data.source.path={last_record_cut.dbn}"],
        "data error: {last_record_cut.dbn}: truncated: record 3 is incomplete (the file ends 36 bytes into it)",
    ),
    ("dbn-corrupt", ["data=databento", "data.source.path={corrupt.dbn.zst}"], "data error: {corrupt.dbn.zst}: corrupt DBN data"),
    (
        "dbn-dataset",
        ["data=databento", "data.source.path={other_dataset.dbn.zst}"],
        "data error: {other_dataset.dbn.zst}: metadata dataset XCME.ITCH, but data.source.dataset=GLBX.MDP3",
    ),
    (
        "dbn-schema",
        ["data=databento", f"data.source.path={REAL_DBN_1H}"],
        f"data error: {REAL_DBN_1H}: schema ohlcv-1h found; DatabentoBarSource.load needs ohlcv-1m bars",
    ),
    (
        "dbn-root",
        ["data=databento", "asset=zn", f"data.source.path={REAL_DBN_1M}"],
        f"data error: {REAL_DBN_1M}: no outright ZN futures contract among the symbols found (ESH1)",
    ),
    # lean
    (
        "lean-cut",
        ["data=lean", "data.source.path={minute_es_20131007_cut_trade.zip}"],
        "data error: {minute_es_20131007_cut_trade.zip}: truncated or damaged zip archive",
    ),
    (
        "lean-damaged",
        ["data=lean", "data.source.path={minute_es_20131007_damaged_trade.zip}"],
        "data error: {minute_es_20131007_damaged_trade.zip}:20131007_es_minute_trade_201312.csv: corrupt compressed data (Error -3 while decompressing data",
    ),
    (
        "lean-root",
        ["data=lean", "asset=nq", f"data.source.path={REAL_LEAN}"],
        f"data error: {REAL_LEAN}: no Lean minute trade bars for root nq (the zips hold root es",
    ),
    # checkpoints (each with data that does not exist: refused before the data is read)
    (
        "ckpt-csv",
        ["ckpt={empty.csv}"],
        "checkpoint error: ckpt={empty.csv}: not a torch checkpoint archive (text starting 'timestamp_utc",
    ),
    ("ckpt-missing", ["ckpt={inputs}/gone.ckpt"], "checkpoint error: ckpt={inputs}/gone.ckpt: file not found"),
    (
        "ckpt-cut",
        ["ckpt={cut.ckpt}"],
        "checkpoint error: ckpt={cut.ckpt}: not a torch checkpoint archive (a zip archive cut short or damaged",
    ),
    (
        "ckpt-unsafe",
        ["ckpt={evil.ckpt}"],
        "checkpoint error: ckpt={evil.ckpt}: refused: it holds objects that torch.load(weights_only=True) does not load (unsupported global test_bad_inputs.Evil)",
    ),
    ("ckpt-foreign", ["ckpt={lightning_only.ckpt}"], "checkpoint error: ckpt={lightning_only.ckpt}: not written by foxhunt"),
    ("ckpt-family", ["ckpt={ppo.ckpt}"], "checkpoint error: ckpt={ppo.ckpt}: a ppo checkpoint, but the config trains model=dqn"),
    ("ckpt-shape", ["ckpt={small.ckpt}"], "checkpoint error: ckpt={small.ckpt}: weights do not fit the config's dqn model: "),
    (
        "ckpt-precision",
        ["ckpt={int8.ckpt}"],
        "checkpoint error: ckpt={int8.ckpt}: weights of precision=int8 do not load into precision=fp32",
    ),
    # stores
    (
        "store-not-sqlite",
        ["logger.tracking_uri=sqlite:///{text_store.db}"],
        "store error: sqlite:///{text_store.db}: not an MLflow SQLite store",
    ),
    ("store-scheme", ["logger.tracking_uri=nosuch://store"], "store error: nosuch://store: cannot open the MLflow store"),
    # folders and sweeps (issue 27): refused before any folder, run or worker is made
    # values only the object they build refuses: a 70-100 line traceback after the run was made (found by a helper)
    ("asset-zone", ["asset.session_tz=Mars/Olympus"], "config error: asset.session_tz='Mars/Olympus': not an IANA time zone"),
    ("asset-open", ["asset.session_open=25:00"], "config error: asset.session_open='25:00': must be a local time"),
    (
        "checkpoint-mode",
        ["callbacks.model_checkpoint.mode=avg"],
        "config error: callbacks.model_checkpoint: `mode` can be min, max but got avg",
    ),
    (
        "budget-target",
        ["budget._target_=foo.Bar"],
        "config error: budget: Error loading 'foo.Bar': ModuleNotFoundError(\"No module named 'foo'\")",
    ),
    (
        "warm-start-path",
        ["callbacks.warm_start.path=/nonexistent.ckpt"],
        "config error: callbacks.warm_start.path=/nonexistent.ckpt",
    ),
    # an empty string passed as "none": a checkpoint refused after the fit, a feature cache in the current folder (a helper)
    # model.name is the family in every record: a DQN run was tagged and ranked as model "foo" (found by a helper)
    (
        "model-name",
        ["model.name=foo"],
        "config error: model.name='foo': not a model family (one of dlinear, dqn, mamba2, ppo, tft",
    ),
    ("model-name-other", ["model.name=ppo"], "config error: model.name='ppo': names the family of kind agent with module"),
    # a 102-line AssertionError ("unscale_ but _scale is None") mid-fit, the run FAILED (found by a helper)
    (
        "fp16-on-cpu",
        ["precision=bf16", "precision.trainer_precision=16-mixed", "trainer.accelerator=cpu"],
        "config error: precision.trainer_precision=16-mixed: float16 training (its loss scaler) needs a CUDA device",
    ),
    # accepted: an untrained model tested and scored, FINISHED; 'maybe' passed (found by a helper)
    (
        "train-batches-zero",
        ["trainer.limit_train_batches=0"],
        "config error: trainer.limit_train_batches=0: 0 batches trains nothing",
    ),
    (
        "val-batches-zero",
        ["trainer.limit_val_batches=0"],
        "config error: trainer.limit_val_batches=0: 0 batches validates nothing",
    ),
    (
        "deterministic",
        ["trainer.deterministic=maybe"],
        "config error: trainer.deterministic='maybe': must be true, false or warn",
    ),
    # a data error once the run was made (found by a helper): the settings' own check, before it
    ("csv-path-empty", ["data=csv", "data.source.path=''"], "config error: data.source.path='': must name a CSV file"),
    (
        "csv-delimiter-empty",
        ["data=csv", "data.source.path=x.csv", "data.source.delimiter=''"],
        "config error: data.source.delimiter='': must be one character",
    ),
    (
        "databento-path-empty",
        ["data=databento", "data.source.path=' '"],
        "config error: data.source.path=' ': must name a Databento",
    ),
    # Lightning's own refusal: one line, but after the run was made (found by a helper reviewing the change)
    (
        "trainer-strategy",
        ["+trainer.strategy=foo"],
        "config error: trainer: You selected an invalid strategy name: `strategy='foo'`",
    ),
    ("trainer-accelerator-empty", ["trainer.accelerator=''"], "config error: trainer: You selected an invalid accelerator name"),
    ("ckpt-empty", ["ckpt=''"], "config error: ckpt='': String should have at least 1 character"),
    ("cache-dir-empty", ["data.cache_dir=''"], "config error: data.cache_dir='': String should have at least 1 character"),
    ("root-is-a-file", ["paths.root_dir={empty.csv}"], "config error: cannot make the folder {empty.csv}/outputs/runs/"),
    (
        "sweep-root-is-a-file",
        ["-m", "paths.root_dir={empty.csv}"],
        "cannot prepare the sweep: config error: cannot make the folder {empty.csv}/outputs/sweeps/",
    ),
    (
        "n-jobs-zero",
        ["-m", "strategy=parallel", "strategy.n_jobs=0"],
        "cannot prepare the sweep: config error: strategy.n_jobs=0: must be an integer in [1, 1024] or auto",
    ),
    (  # -m after an override: argparse's 9-line usage block, "unrecognized arguments" (found by a helper)
        "multirun-after-an-override",
        ["strategy=parallel", "-m", "strategy.n_jobs=0"],
        "cannot prepare the sweep: config error: strategy.n_jobs=0: must be an integer in [1, 1024] or auto",
    ),
    (
        "n-jobs-negative",
        ["-m", "strategy=parallel", "strategy.n_jobs=-3"],
        "cannot prepare the sweep: config error: strategy.n_jobs=-3: must be an integer in [1, 1024] or auto",
    ),
    # ranges (issue 35): a value that would reach Lightning or the data generator is refused first
    (
        "limit-negative",
        ["trainer.limit_train_batches=-1"],
        "config error: trainer.limit_train_batches=-1: must be a number of batches, an integer in [0, 1000000000], or a fraction of them",
    ),
    (
        "days-absurd",
        ["data.source.days=10000000000"],
        "config error: data.source.days=10000000000: must be a whole number in [1, 7305]",
    ),
]
NO_DATA = "data=csv data.source.path=/nonexistent/bars.csv".split()


def _fill(text: str, battery: Battery) -> str:
    names = {name: str(path) for name, path in battery.files.items()}
    names["inputs"] = str(battery.root / "inputs")
    for name, value in names.items():
        text = text.replace("{" + name + "}", value)
    return text


@pytest.mark.parametrize(("args", "expected"), [c[1:] for c in TRAIN_CASES], ids=[c[0] for c in TRAIN_CASES])
def test_bad_input_is_one_line_exit_2_no_traceback_and_nothing_changed(battery, args, expected, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")
    argv = [_fill(a, battery) for a in args] + SMOKE
    if any(a.startswith("ckpt=") for a in argv):
        argv += NO_DATA
    before = _snapshot(battery)
    folders = set((battery.root / "outputs").rglob("*"))

    code = run_foxhunt_train(monkeypatch, battery.root, argv)
    err = capsys.readouterr().err

    lines = [line for line in err.splitlines() if line.strip()]
    assert code == EXIT_USER_ERROR, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("foxhunt-train: ") and _fill(expected, battery) in lines[0], lines[0]
    assert "weights_only=False" not in err
    runs, digests = _snapshot(battery)
    assert digests == before[1]  # no input file touched
    assert {k: v for k, v in runs.items() if k in before[0]} == before[0]  # no earlier run changed
    new = [run for run_id, run in runs.items() if run_id not in before[0]]
    if lines[0].startswith("foxhunt-train: data error"):  # the run was made: it ended FAILED, same line
        assert len(new) == (2 if "evaluation.protocol=walk_forward" in argv else 1)  # a cell run and its fold
        for status, tags, _, _ in new:
            assert status == "FAILED" and "foxhunt-train: " + tags["error"] == lines[0]
    else:  # config, checkpoint and store errors stop before any run is made, and leave no folder (a run's folder
        # of .hydra/ and an empty train.log was left each time: found by a helper probing the CLI)
        assert new == []
        assert set((battery.root / "outputs").rglob("*")) - folders <= {battery.root / "outputs" / "runs"}


def test_the_slurm_strategy_without_slurm_is_one_line_before_the_sweep(battery, monkeypatch, capsys, tmp_path):
    """strategy=slurm on a machine without SLURM was submitit's 38-line traceback ("Could not
    detect srun"), exit 1, after the sweep's parent run was made (found by a helper probing the CLI)."""
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no srun
    before = _snapshot(battery)
    code = run_foxhunt_train(monkeypatch, battery.root, ["-m", "strategy=slurm", *SMOKE])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == EXIT_USER_ERROR and len(lines) == 1, lines
    assert lines[0].startswith("foxhunt-train: cannot prepare the sweep: config error: strategy=slurm: sbatch and srun not "
                               "found on PATH")  # fmt: skip
    assert _snapshot(battery) == before  # no parent run


def test_the_traceback_is_shown_when_asked_for_and_for_a_bug(battery, monkeypatch, capsys):
    from foxhunt import train
    from foxhunt.data.errors import BarDataError

    monkeypatch.setenv("FOXHUNT_ROOT", str(battery.root))
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")
    bad = ["data=csv", f"data.source.path={battery.files['empty.csv']}", "logger=none", *SMOKE]
    monkeypatch.setenv("FOXHUNT_DEBUG", "1")
    monkeypatch.setattr(sys, "argv", ["foxhunt-train", *bad])
    with pytest.raises(BarDataError, match="no bars"):
        train.main()
    monkeypatch.setenv("FOXHUNT_DEBUG", "0")
    monkeypatch.setattr(sys, "argv", ["foxhunt-train", "--debug", *bad])
    with pytest.raises(BarDataError, match="no bars"):
        train.main()

    def bug(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(train, "run_cell", bug)
    monkeypatch.setattr(sys, "argv", ["foxhunt-train", *bad])
    with pytest.raises(KeyError, match="a bug"):  # a bug keeps its traceback, without --debug
        train.main()


# ----------------------------------------------------------------------------- foxhunt (CLI)
CLI_CASES = [
    ("job-id", ["train", "status", "nosuchjob"], "nosuchjob"),
    ("list-status", ["train", "list", "--status", "BOGUS"], "--status BOGUS: expected one of"),
    ("watch-job-id", ["train", "watch", "nosuchjob"], "nosuchjob"),
    ("stop-job-id", ["train", "stop", "nosuchjob"], "nosuchjob"),
    ("store-not-sqlite", ["train", "list", "--tracking-uri", "sqlite:///{text_store.db}"], "{text_store.db}"),
    ("root-missing", ["train", "list", "--root", "/nonexistent/foxhunt"], "--root /nonexistent/foxhunt: no such folder"),
    # under the command's own name, a file named as one (it said "foxhunt train: ... no such folder": found by a helper)
    (
        "runs-root-missing",
        ["runs", "top", "--root", "/nonexistent/foxhunt"],
        "foxhunt runs: --root /nonexistent/foxhunt: no such",
    ),
    ("runs-root-a-file", ["runs", "top", "--root", "{empty.csv}"], "foxhunt runs: --root {empty.csv}: not a folder"),
    ("override-newline", ["train", "start", "model=dqn\nfake line"], "overrides model=dqn\\nfake line: "),
    # money (issue 35): bounded where float arithmetic stays exact to the cent, refused before the store is opened
    (
        "capital-absurd",
        ["ensemble", "paper", "paper.capital_usd=1e308"],
        "foxhunt ensemble paper: config error: paper.capital_usd=1e+308: Input should be less than or equal to 10000000000 (allowed: a number in (0, 1e10])",
    ),
    (
        "slippage-absurd",
        ["ensemble", "replay", "execution.slippage_ticks=1e300"],
        "foxhunt ensemble replay: config error: execution.slippage_ticks=1e+300: Input should be less than or equal to 100 (allowed: a number in [0, 100])",
    ),
]


@pytest.mark.parametrize(("args", "expected"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_cli_argument_is_one_line_and_nothing_changed(battery, args, expected):
    from typer.testing import CliRunner

    from foxhunt.cli import app

    before = _snapshot(battery)
    result = CliRunner().invoke(app, [_fill(a, battery) for a in args], env={"FOXHUNT_ROOT": str(battery.root)})
    err = result.stderr if result.stderr_bytes is not None else result.output
    lines = [line for line in err.splitlines() if line.strip()]
    assert result.exit_code == 2 and (result.exception is None or isinstance(result.exception, SystemExit)), result.output
    assert "Traceback" not in result.output and len(lines) == 1, result.output
    assert _fill(expected, battery) in lines[0]
    assert _snapshot(battery) == before


# ----------------------------------------------------------------------------- from a shell
def _shell(args: list[str], root: Path) -> subprocess.Popen:
    env = {**os.environ, "FOXHUNT_ROOT": str(root), "HYDRA_FULL_ERROR": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("FOXHUNT_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "foxhunt.train", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=root)  # fmt: skip


def _ended(process: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_from_a_shell_a_data_error_and_a_checkpoint_error_are_one_line(battery):
    """The real process: stderr holds the one line and nothing else (no Hydra line, no traceback).
    The two processes run at once (each spends seconds importing torch, Lightning and MLflow)."""
    started = (_shell(["data=csv", f"data.source.path={battery.files['high_below_low.csv']}", *SMOKE], battery.root),
               _shell([f"ckpt={battery.files['empty.csv']}", *SMOKE, *NO_DATA], battery.root))  # fmt: skip
    data, ckpt = (_ended(process) for process in started)
    assert data.returncode == EXIT_USER_ERROR
    assert data.stderr.strip().splitlines() == [
        f"foxhunt-train: data error: {battery.files['high_below_low.csv']}: line 3 (2024-01-02T00:01:00+00:00): high=99.75 < low=100.0"
    ], data.stderr
    assert ckpt.returncode == EXIT_USER_ERROR
    (line,) = ckpt.stderr.strip().splitlines()
    assert line.startswith(f"foxhunt-train: checkpoint error: ckpt={battery.files['empty.csv']}: not a torch checkpoint archive")
