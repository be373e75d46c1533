"""foxhunt: train trading models on CME futures under a measured device-memory budget."""

from foxhunt.console import silence_known_noise

__version__ = "0.1.0"

silence_known_noise()
