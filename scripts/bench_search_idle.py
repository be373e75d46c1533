#!/usr/bin/env python
"""Worker idle time of a search on 2 workers: a trial starts when a worker frees, against batches.

    python scripts/bench_search_idle.py                     # 20 trials, 2 workers, both dispatches
    python scripts/bench_search_idle.py --trials 10 --keep /tmp/idle

Each dispatch runs the same real search, ``foxhunt-train -m hparams_search=dqn_optuna
strategy=parallel hydra.sweeper.n_jobs=2`` (joblib's loky workers, one torch thread each), in a
fresh ``FOXHUNT_ROOT`` with the same seeded random sampler (``optuna.samplers.RandomSampler``:
its draws do not depend on the results or on which trials are running, so both dispatches run
the same 20 trials, and their busy time is the same work):

- ``free``: foxhunt's sweeper as shipped (``hydra.sweeper.barrier=false``): a new trial starts
  as soon as a worker's trial ends;
- ``batch``: ``hydra.sweeper.barrier=true``: ask 2 trials, launch them, wait for both, as
  Hydra's Optuna sweeper (hydra-optuna-sweeper 1.3) did.

Trials are DQN fits of ``--steps`` training batches (``trainer=smoke`` otherwise) on a week of
synthetic ES bars: the searched sizes (hidden layers, batch size) make their durations differ,
as in a real search. The figures come from the sweep's ``workers.json``
(:class:`foxhunt.sweeps.trials.PoolReport`): for each trial the worker slot and the time it
started and ended (seconds from the first start, ``time.perf_counter`` in the sweep's process,
the launch included: a job's start and end in its worker and the return of its result);
``idle_while_waiting``: the slots' time without a trial from the first start to the last
start (while trials were still to start: what a barrier costs); ``idle``: the same to the last
end (the tail, when fewer trials than workers remain, is idle for any dispatch). Printed with
the whole command's wall time and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIALS = 20
WORKERS = 2
STEPS = 40  # training batches per trial (trainer.limit_train_batches)


def run(root: Path, trials: int, workers: int, steps: int, barrier: bool) -> dict:
    command = [str(Path(sys.executable).parent / "foxhunt-train"), "-m", "hparams_search=dqn_optuna", "trainer=smoke",
               f"trainer.limit_train_batches={steps}", "data.source.days=7", "strategy=parallel", "strategy.predict_memory=false",
               f"hydra.sweeper.n_jobs={workers}", f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.barrier={str(barrier).lower()}",
               "strategy.torch_threads=1", "hydra.sweeper.sampler._target_=optuna.samplers.RandomSampler",
               "~hydra.sweeper.sampler.n_startup_trials", "~hydra.sweeper.sampler.constant_liar"]  # fmt: skip
    env = {**os.environ, "FOXHUNT_ROOT": str(root)}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"search failed ({done.returncode}):\n{done.stderr[-3000:]}")
    (sweep,) = sorted((root / "outputs" / "sweeps").iterdir())
    figures = json.loads((sweep / "workers.json").read_text())
    figures["command_s"] = round(wall, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=TRIALS)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--keep", type=Path, default=None, help="keep the stores and sweep folders here")
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="foxhunt-idle-"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs", flush=True)
    rows = {}
    for name, barrier in (("free", False), ("batch", True)):
        root = base / name
        root.mkdir(parents=True, exist_ok=True)
        rows[name] = run(root, args.trials, args.workers, args.steps, barrier)
        f = rows[name]
        print(f"{name:5}  trials {len(f['trials'])}  wall {f['wall_s']:.1f} s  busy {f['busy_s']:.1f} s  "
              f"idle while trials waited {f['idle_while_waiting_s']:.1f} s ({100 * f['idle_while_waiting_share']:.1f}%)  "
              f"idle to the end {f['idle_s']:.1f} s ({100 * f['idle_share']:.1f}%)  command {f['command_s']:.1f} s", flush=True)  # fmt: skip
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps({name: {k: v for k, v in f.items() if k != "trials"} for name, f in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
