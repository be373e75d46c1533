"""SIGTERM outside a fit (``foxhunt train stop``, a scheduler, the sweep's orphan watcher) stops
the run at its next phase boundary and ends it KILLED with exit status 143: while the cell built
its data the process died on the spot, its run left RUNNING, and in the test stage Lightning
noted the signal and went on to a FINISHED run, exit 0 (found by a helper probing kill and
resume). Each case runs a training in a process of its own, the signal sent from inside it at
the phase named."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from foxhunt.runs.store import RunStore

SCRIPT = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, {tests!r})
    import lightning.pytorch as pl
    import foxhunt.training.fit as fit
    from configs import compose_train_config
    from foxhunt.training.cell import run_cell

    phase = {phase!r}
    if phase == "build":  # while the data and the model are built
        built = fit.build_parts
        def build_parts(cfg):
            signal.raise_signal(signal.SIGTERM)
            return built(cfg)
        fit.build_parts = build_parts
    else:  # as the test stage starts, Lightning's handler in place
        class Term(pl.Callback):
            def on_test_start(self, trainer, pl_module):
                signal.raise_signal(signal.SIGTERM)
        run = fit.fit_and_score
        fit.fit_and_score = lambda cfg, callbacks, *a, **k: run(cfg, [*callbacks, Term()], *a, **k)
        import foxhunt.training.cell as cell
        cell.fit_and_score = fit.fit_and_score
    cfg = compose_train_config(["model=dqn", "trainer=smoke", "data.source.days=5", "evaluation.plot_equity=false"],
                               __import__("pathlib").Path({root!r}))
    try:
        run_cell(cfg)
    except SystemExit as exc:
        sys.exit(143 if not exc.code else exc.code)
    print("finished")
""")


@pytest.mark.parametrize("phase", ["build", "test"])
def test_sigterm_outside_a_fit_ends_the_run_killed_at_the_next_phase(tmp_path, phase):
    script = SCRIPT.format(tests=str(Path(__file__).parents[1]), phase=phase, root=str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 143, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert "finished" not in done.stdout
    (run,) = RunStore(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}").search("foxhunt")
    assert run.status == "KILLED" and run.tags.get("stop_reason") == "SIGTERMException", run.tags
