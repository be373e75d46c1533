"""Jobs: the processes that train a grid in the background, and what the job commands show.

- :mod:`~foxhunt.jobs.launch`: plan (compose and validate every cell), start, resume and stop a
  job; :mod:`~foxhunt.jobs.supervisor`: the leader of a job's process group;
  :mod:`~foxhunt.jobs.launch_file`: the plan and the launch file;
- :mod:`~foxhunt.jobs.views`: runs grouped into jobs and their states; :mod:`~foxhunt.jobs.listing`
  and :mod:`~foxhunt.jobs.display`: filters, JSON and tables of ``foxhunt train list|status|watch``;
- the callbacks a training run carries for its job live with the run (:mod:`foxhunt.training.graceful_stop`:
  ``interrupted.ckpt`` on a stop request; :mod:`foxhunt.training.progress`: the ``progress`` metric).

The store itself (runs, cells, statuses, tags, liveness, checkpoints) is :mod:`foxhunt.runs`.
"""
