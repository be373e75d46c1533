"""SIGTERM outside a fit (``foxhunt train stop``, a scheduler, the sweep's orphan watcher) stops
the run at its next phase boundary and ends it KILLED with exit status 143: while the cell built
its data the process died on the spot, its run left RUNNING, and in the test stage Lightning
noted the signal and went on to a FINISHED run, exit 0 (found by a helper probing kill and
resume). Both cases in one process of their own (a SIGTERM's default action ends the process),
one run each, the signal sent from inside it at the phase named."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from foxhunt.runs.store import RunStore

SCRIPT = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    import lightning.pytorch as pl
    import foxhunt.training.cell as cell
    import foxhunt.training.fit as fit
    from configs import compose_train_config

    built, run = fit.build_parts, fit.fit_and_score

    def build_parts(cfg):  # while the data and the model are built
        signal.raise_signal(signal.SIGTERM)
        return built(cfg)

    class Term(pl.Callback):  # as the test stage starts, Lightning's handler in place
        def on_test_start(self, trainer, pl_module):
            signal.raise_signal(signal.SIGTERM)

    codes = []
    for phase in ("build", "test"):
        fit.build_parts = build_parts if phase == "build" else built
        cell.fit_and_score = fit.fit_and_score = (
            run if phase == "build" else lambda cfg, callbacks, *a, **k: run(cfg, [*callbacks, Term()], *a, **k))
        cfg = compose_train_config(["model=dqn", "trainer=smoke", "data.source.days=5", "evaluation.plot_equity=false",
                                    f"seed={{len(codes)}}"], Path({root!r}))
        try:
            cell.run_cell(cfg)
            codes.append(0)
        except SystemExit as exc:
            codes.append(143 if not exc.code else exc.code)
    print("codes", codes)
""")


def test_sigterm_outside_a_fit_ends_the_run_killed_at_the_next_phase(tmp_path):
    script = SCRIPT.format(tests=str(Path(__file__).parents[1]), root=str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "codes [143, 143]" in done.stdout, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    runs = RunStore(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}").search("foxhunt")
    assert sorted(r.tags["seed"] for r in runs) == ["0", "1"]
    assert all(r.status == "KILLED" and r.tags.get("stop_reason") == "SIGTERMException" for r in runs), [r.tags for r in runs]
