"""foxhunt: train trading models on CME futures under a measured device-memory budget."""
__version__ = "0.1.0"
