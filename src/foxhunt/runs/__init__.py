"""The run store's one owner: what the MLflow store holds about runs, cells, jobs and resume.

- :mod:`~foxhunt.runs.status`: ``Status`` (MLflow's statuses plus STALE, SKIPPED, PENDING,
  STARTING); :mod:`~foxhunt.runs.tags`: every tag and param name;
- :mod:`~foxhunt.runs.cell`: ``CellKey`` (model, asset, precision, seed, config hash) and
  ``CellResult``; :mod:`~foxhunt.runs.config_hash`: what makes two runs "the same training";
- :mod:`~foxhunt.runs.store`: ``RunStore`` (create, reopen, end, tag, search, logged files, the
  model registry), the only ``MlflowClient`` (opened under the store's file lock, SQLite
  connections with a busy timeout: concurrent writers lose nothing; ``StoreError`` for a store
  that cannot be opened; ``forget_metrics_after`` for a resumed run); :mod:`~foxhunt.runs.sqlite_reader`: the read-only
  SQLite fast path of the job commands; :mod:`~foxhunt.runs.stored`: a run as read;
- :mod:`~foxhunt.runs.tracked_run`: one training run from creation to its final status;
- :mod:`~foxhunt.runs.liveness`: is a RUNNING run still running (STALE otherwise);
  :mod:`~foxhunt.runs.checkpoints`: which checkpoint a run continues from;
  :mod:`~foxhunt.runs.resume`: what ``resume=true`` does with a run;
- :mod:`~foxhunt.runs.provenance`: where a run came from (process, Source, Dataset);
  :mod:`~foxhunt.runs.environment`: where the store is (``$FOXHUNT_ROOT``, the store's URI).

The model registry API (for the ensemble; signatures in :mod:`foxhunt.runs.store`):
``RunStore(uri).register_model_version(name, run_id, source, tags=None, alias=None)``,
``set_alias(name, alias, version)``, ``get_version_by_alias(name, alias)``,
``search_finished_runs(experiment, filter_string="")``.

Importing this package (or any module here but ``tracked_run``) loads neither torch, lightning
nor mlflow: the job commands read the store through it in well under a second.
"""
