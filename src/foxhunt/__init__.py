"""foxhunt: train trading models on CME futures under a measured device-memory budget."""

from foxhunt.config.resolvers import register_resolvers
from foxhunt.console import silence_known_noise
from foxhunt.precision.auto import register_resolver

__version__ = "0.1.0"

silence_known_noise()
register_resolver()  # ${foxhunt.auto_precision:...} of conf/precision/auto.yaml
register_resolvers()  # ${foxhunt.run_suffix:} of conf/hydra/default.yaml
