"""Sweeps of the model x asset grid: the Hydra glue around ``foxhunt-train -m``.

Hydra runs the sweep; this package adds what Hydra's launchers lack:
- :mod:`foxhunt.sweeps.callback`: the Hydra callback that prepares the MLflow store and the
  sweep's parent run before any job starts, and prints and logs the summary at the end
  (:mod:`~foxhunt.sweeps.summary`);
- :mod:`foxhunt.sweeps.packing`: the joblib launcher's ``n_jobs=auto``, from the cells' memory
  estimates (:mod:`~foxhunt.sweeps.estimates`), the budget and the cores and devices
  (:mod:`~foxhunt.sweeps.resources`);
- :mod:`foxhunt.sweeps.sweep_cell`: one cell of a sweep (a Hydra job) (threads, device, failure isolation,
  ``cell.json``); :mod:`foxhunt.sweeps.grid`: the expansion of a sweep into its cells;
- :mod:`foxhunt.sweeps.slurm`: a cell in a SLURM job (``strategy=slurm``): SLURM's notice
  before a time limit or a preemption checkpoints the fit and requeues the job, a requeued job
  continues the cell's run;
- :mod:`foxhunt.sweeps.search`: search sweeps (``hparams_search=...``, Hydra's Optuna sweeper):
  trial names and folders, the largest trial the packing plans from, the best trial.

What a sweep records (runs, cells, resume) is the store's: :mod:`foxhunt.runs`.
"""
