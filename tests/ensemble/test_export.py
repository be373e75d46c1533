"""``foxhunt ensemble export``: each member's streaming step as ONNX or TorchScript, replayed by
ONNX Runtime on a split: positions identical to foxhunt's own streaming path, forecasts within
1e-4; the command end to end and its one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ensemble_helpers import cli
from test_parity import _parts, member_of, replay_split

from foxhunt.ensemble.export import run_onnx, streaming_step, write_step
from foxhunt.models.forecaster import signal_position

TOLERANCE = 1e-4


def _exported(parts, tmp_path, fmt="onnx"):
    step = streaming_step(parts.model, parts.dataset.manifest())
    path = tmp_path / ("step.onnx" if fmt == "onnx" else "step.pt")
    diff = write_step(step, path, fmt)
    assert diff < TOLERANCE
    return path


@pytest.mark.parametrize("family", ["dqn", "ppo"])
def test_an_exported_agent_walks_the_replay_of_foxhunt(compose_cfg, tmp_path, family):
    cfg, parts = _parts(compose_cfg, family)
    path = _exported(parts, tmp_path)
    streamed = replay_split(cfg, parts, member_of(family, parts.model, parts.dataset, "torch"), "test").positions[family]
    position, walked = 0.0, []
    for row in parts.dataset.splits["test"].features:
        (scores,) = run_onnx(path, {"obs": np.append(row, position)[None]})
        position = float(np.argmax(scores[0]) - 1)
        walked.append(int(position))
    assert (np.asarray(walked) != 0).sum() > len(walked) // 10  # it really trades
    np.testing.assert_array_equal(walked, streamed)


def test_exported_mamba2_carries_its_state_as_foxhunt_does(compose_cfg, tmp_path):
    cfg, parts = _parts(compose_cfg, "mamba2")
    model, path = parts.model, _exported(parts, tmp_path)
    replayed = replay_split(cfg, parts, member_of("mamba2", model, parts.dataset, "torch"), "val")
    state = model.allocate_inference_state(1)
    conv, ssm = torch.stack([s.conv for s in state]).numpy(), torch.stack([s.ssm for s in state]).numpy()
    signals, positions = [], []
    for bar, row in enumerate(parts.dataset.splits["val"].features):
        forecast, conv, ssm = run_onnx(path, {"x": row[None], "conv": conv, "ssm": ssm})
        signal = float(forecast[0, :, model.median_index].sum())
        ready = bar + 1 >= model.seq_len
        signals.append(signal if ready else np.nan)
        positions.append(signal_position(signal, float(model.position_threshold)) if ready else 0)
    np.testing.assert_array_equal(positions, replayed.positions["mamba2"])
    np.testing.assert_allclose(signals, replayed.signals["mamba2"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("family,fmt", [("tft", "onnx"), ("tft", "torchscript"), ("dlinear", "onnx")])
def test_exported_window_forecasts_as_foxhunt_streams(compose_cfg, tmp_path, family, fmt):
    cfg, parts = _parts(compose_cfg, family)
    model, path = parts.model, _exported(parts, tmp_path, fmt)
    replayed = replay_split(cfg, parts, member_of(family, model, parts.dataset, "torch"), "test")
    windows = parts.datamodule.input_windows("test")
    feeds = {k: windows[k].numpy() for k in ("static", "known", "observed")}
    if fmt == "onnx":
        (forecast,) = run_onnx(path, feeds)
    else:
        with torch.no_grad():
            forecast = torch.jit.load(str(path))(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    with torch.no_grad():
        expected = model.predict_windows(windows, 512).numpy()
    np.testing.assert_allclose(forecast, expected, atol=TOLERANCE, rtol=0)
    signals = forecast[..., model.median_index].sum(-1)
    bars = windows["bar_index"].numpy()
    np.testing.assert_allclose(signals, replayed.signals[family][bars], atol=TOLERANCE, rtol=0)
    positions = [signal_position(float(s), float(model.position_threshold)) for s in signals]
    np.testing.assert_array_equal(positions, replayed.positions[family][bars])


def test_export_command_writes_every_member_with_its_spec(store_root, tmp_path):
    assert cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none").exit_code == 0
    # the ensemble deciding with int8 weights: the export (fp32 weights) said nothing of it, and its decisions
    # differed (829 trades against 831; found by a helper). member.json and a line on stderr say which
    for fmt, name, weights in (("onnx", "step.onnx", "auto"), ("torchscript", "step.pt", "int8")):
        result = cli(store_root, "ensemble", "export", "asset=es", "--format", fmt, "--out", str(tmp_path / fmt),
                     f"ensemble.weights={weights}")  # fmt: skip
        assert result.exit_code == 0, result.output
        said = "exported with its fp32 weights; foxhunt's ensemble decides with int8 (ensemble.weights=int8)"
        assert result.output.count(said) == (4 if weights == "int8" else 0), result.output
        folders = sorted(p.name for p in (tmp_path / fmt).iterdir())
        assert folders == ["foxhunt-dqn-es-v1", "foxhunt-mamba2-es-v1", "foxhunt-ppo-es-v1", "foxhunt-tft-es-v1"]
        assert result.output.count("max |diff|") == 4
        for folder in folders:
            spec = json.loads((tmp_path / fmt / folder / "member.json").read_text())
            assert (tmp_path / fmt / folder / name).is_file() and spec["file"] == name and spec["format"] == fmt
            width = len(spec["features"]["names"])
            assert len(spec["features"]["offset"]) == len(spec["features"]["scale"]) == width
            assert spec["registered_version"] == "1" and spec["asset"]["key"] == "es" and spec["decision"]["rule"]
            assert (spec["weights"], spec["ensemble_weights"]) == ("fp32", "fp32" if weights == "auto" else "int8")
    assert not (store_root / "mlflow.db").exists()  # no stray store made in the working folder


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "tflite"], "--format tflite: must be one of onnx, torchscript"),
        (["asset=nq"], "models:/foxhunt-dqn-nq@champion: not in the registry"),
    ],
)  # fmt: skip
def test_export_bad_input_is_one_line(store_root, tmp_path, args, message):
    result = cli(store_root, "ensemble", "export", *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("foxhunt ensemble export: ") and message in lines[-1]
    assert "Traceback" not in result.output


def _export_dqn(store_root, out):
    assert cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none").exit_code == 0
    return cli(store_root, "ensemble", "export", "asset=es", "ensemble.models=[dqn]", "--out", out)


def test_export_never_writes_through_a_link_planted_in_out(store_root, tmp_path):
    """A link where a member's folder goes is refused before anything is written; a link where
    one of its files goes is replaced by the file, the file it pointed to left as it was."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "foxhunt-dqn-es-v1").symlink_to(outside, target_is_directory=True)
    result = _export_dqn(store_root, str(out))
    assert result.exit_code == 2, result.output
    line = [line for line in result.output.splitlines() if line.strip()][-1]
    assert line.startswith("foxhunt ensemble export: export error: --out ") and "foxhunt-dqn-es-v1 is a symbolic link" in line, (
        line
    )
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"] and victim.read_text() == "keep me"

    (out / "foxhunt-dqn-es-v1").unlink()
    (out / "foxhunt-dqn-es-v1").mkdir()
    for name in ("step.onnx", "member.json"):
        (out / "foxhunt-dqn-es-v1" / name).symlink_to(victim)
    result = _export_dqn(store_root, str(out))
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "keep me" and sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    for name in ("step.onnx", "member.json"):
        written = out / "foxhunt-dqn-es-v1" / name
        assert not written.is_symlink() and written.stat().st_size > 0
    assert sorted(p.name for p in (out / "foxhunt-dqn-es-v1").iterdir()) == ["member.json", "step.onnx"]  # no temporary left


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("", "--out is empty: name the folder"),
        ("{file}/sub", "cannot make the folder (Not a directory)"),
    ],
)  # fmt: skip
def test_an_out_that_cannot_be_written_is_one_line(store_root, tmp_path, out, message):
    (tmp_path / "file").write_text("a file, not a folder")
    result = cli(
        store_root, "ensemble", "export", "asset=es", "ensemble.models=[dqn]", "--out", out.format(file=tmp_path / "file")
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("foxhunt ensemble export: ") and message in lines[-1] and "Traceback" not in result.output
    assert not any(tmp_path.glob("foxhunt-*")) and not (store_root / "foxhunt-dqn-es-v1").exists()


def test_a_folder_that_fails_while_writing_is_one_line(tmp_path, monkeypatch):
    """A write refused by the system (a full disk, permissions root ignores) is one line."""
    import errno
    import os

    from foxhunt.ensemble.export import ExportError, write_inside

    real = os.open

    def refusing(path, flags, *args, **kwargs):
        if str(path).endswith(".tmp"):
            raise OSError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(ExportError, match=r"^--out .*: cannot write foxhunt-x-v1/\.step\.onnx\.\d+\.tmp \(Permission denied\)$"):
        write_inside(tmp_path, "foxhunt-x-v1", {"step.onnx": b"graph"})
