"""Warm start (callbacks.warm_start, foxhunt.training.warm_start): a fresh fit whose weights
start from another run's checkpoint or a version's weights.pt, its loop fresh; a file that does
not fit is one line naming the key; a resumed fit keeps its own weights."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from foxhunt.errors import ConfigError
from foxhunt.training.warm_start import SHA_TAG, WarmStart, read_weights

QUICK = ["trainer=smoke", "data.source.days=8", "evaluation.plot_equity=false", "evaluation.max_bars=200",
         "evaluation.bootstrap.samples=20", "strategy.torch_threads=1", "trainer.max_epochs=1",
         "trainer.limit_train_batches=6", "model=dqn", "model.module.hidden_sizes=[32,32]",
         "model.module.min_replay_size=8"]  # fmt: skip


class _FirstStep:
    """Records the module's weights and the global step when the first training batch starts."""

    def __init__(self) -> None:
        import lightning.pytorch as pl

        seen = self.seen = {}

        class _Record(pl.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
                if not seen:
                    seen["step"] = trainer.global_step
                    seen["state"] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

        self.callback = _Record()

    def around(self, fit):
        return lambda cfg, callbacks, *args, **kwargs: fit(cfg, [*callbacks, self.callback], *args, **kwargs)


def _fit(root: Path, name: str, overrides: list[str], monkeypatch=None) -> _FirstStep:
    import foxhunt.training.cell as cell
    from configs import compose_train_config

    first = _FirstStep()
    with monkeypatch.context() as patched:
        patched.setattr(cell, "fit_and_score", first.around(cell.fit_and_score))
        cell.train(compose_train_config([*QUICK, *overrides, f"paths.output_dir={root / 'outputs' / name}"], root))
    return first


def test_a_warm_started_fit_begins_at_the_files_weights_with_a_fresh_loop(tmp_path, monkeypatch):
    """The second fit's first step sees exactly the first fit's final weights, at global step 0
    (a ckpt= start would have resumed at the first fit's step and trained nothing more), and its
    run records the file's SHA-256; from a registered version's plain weights.pt too."""
    _fit(tmp_path, "first", ["seed=1"], monkeypatch)
    last = tmp_path / "outputs" / "first" / "checkpoints" / "last.ckpt"
    trained = torch.load(last, weights_only=True)["state_dict"]
    plain = tmp_path / "weights.pt"  # what a registered version holds
    torch.save(trained, plain)
    for name, path in (("from-ckpt", last), ("from-weights", plain)):
        warm = _fit(tmp_path, name, ["seed=2", f"callbacks.warm_start.path={path}"], monkeypatch)
        assert warm.seen["step"] == 0
        assert [k for k in trained if not torch.equal(trained[k], warm.seen["state"][k])] == []
    cold = _fit(tmp_path, "cold", ["seed=2"], monkeypatch)
    assert any(not torch.equal(trained[k], cold.seen["state"][k]) for k in trained)
    with sqlite3.connect(tmp_path / "mlruns" / "mlflow.db") as db:
        tags = [value for (value,) in db.execute("SELECT value FROM tags WHERE key = ?", (SHA_TAG,))]
    assert len(tags) == 2 and all(len(t) == 64 for t in tags)


def test_weights_of_another_model_are_one_line_naming_the_key(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"net.0.weight": torch.zeros(3, 3)}, path)  # another family's layer
    warm = WarmStart(path)
    module = torch.nn.Sequential(torch.nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"^callbacks\.warm_start\.path=.*other\.pt: the weights do not fit") as error:
        warm.on_fit_start(SimpleNamespace(ckpt_path=None, loggers=[]), module)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "no such file"), (b"not a zip", "not a torch.save archive"), ([1, 2], "holds no state dict of tensors")],
)
def test_a_file_that_holds_no_weights_is_one_line(tmp_path, content, problem):
    path = tmp_path / "start.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(ConfigError, match=rf"^callbacks\.warm_start\.path=.*start\.pt: {problem}"):
        read_weights(path)
    if content is None:  # refused when the callback is built, before the data and the model
        with pytest.raises(ConfigError, match="no such file"):
            WarmStart(path)


def test_a_resumed_fit_keeps_its_own_weights(tmp_path):
    path = tmp_path / "start.pt"
    torch.save({"weight": torch.ones(2, 2)}, path)
    module = torch.nn.Linear(2, 2, bias=False)
    before = module.weight.detach().clone()
    WarmStart(path).on_fit_start(SimpleNamespace(ckpt_path="last.ckpt", loggers=[]), module)
    assert torch.equal(module.weight, before)
    WarmStart(path).on_fit_start(SimpleNamespace(ckpt_path=None, loggers=[]), module)
    assert torch.equal(module.weight, torch.ones(2, 2))
