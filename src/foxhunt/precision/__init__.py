"""Precision policies: how a model and its optimizer are represented while training."""

from foxhunt.precision.policy import PrecisionPolicy

__all__ = ["PrecisionPolicy"]
