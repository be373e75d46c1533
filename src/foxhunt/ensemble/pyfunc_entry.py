"""The code file of a registered member's MLflow model (MLflow's "models from code").

MLflow copies this file into each version's model folder and runs it to load the model: it
builds :class:`foxhunt.ensemble.pyfunc.FoxhuntMember`, whose weights are read with
``torch.load(weights_only=True)``. No pickle is written or run. foxhunt's own commands check that
a version's copy is this file, byte for byte, before they use the version
(:mod:`foxhunt.ensemble.member_files`).
"""

import mlflow.models

from foxhunt.ensemble.pyfunc import FoxhuntMember

mlflow.models.set_model(FoxhuntMember())
