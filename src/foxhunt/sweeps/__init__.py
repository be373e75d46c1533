"""Sweeps of the model x asset grid: strategies, memory-aware packing, resume, summaries.

Hydra runs the sweep (``foxhunt-train -m``); this package adds what Hydra's launchers lack:
- :mod:`foxhunt.sweeps.callback`: the Hydra callback that prepares the MLflow store and the
  sweep's parent run before any job starts, and prints and logs the summary at the end;
- :mod:`foxhunt.sweeps.packing`: the joblib launcher's ``n_jobs=auto``, from the cells' memory
  estimates, the budget and the core count;
- :mod:`foxhunt.sweeps.cell`: one job of a sweep (threads, device, resume, failure isolation);
- :mod:`foxhunt.sweeps.cells`, :mod:`~foxhunt.sweeps.estimates`, :mod:`~foxhunt.sweeps.resume`,
  :mod:`~foxhunt.sweeps.resources`, :mod:`~foxhunt.sweeps.summary`: the parts they share.
"""
