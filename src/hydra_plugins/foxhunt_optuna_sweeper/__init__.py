"""foxhunt's Optuna sweeper for Hydra (``hydra/sweeper=foxhunt_optuna``): current Optuna, the study
in a database, resume, pruning, and a new trial whenever a worker frees.

Hydra finds it in the ``hydra_plugins`` namespace package (shipped with foxhunt: pyproject's
package find). The logic lives in :mod:`foxhunt.sweeps.trials` (the ask-and-tell pool) and
:mod:`foxhunt.sweeps.study` (the study, its database, resume and the retry rule); this package
is the Hydra glue: the config schema (:mod:`.config`) and the :class:`~.sweeper.FoxhuntOptunaSweeper`.
"""
