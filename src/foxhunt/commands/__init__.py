"""Sub-commands of the ``foxhunt`` CLI, one module per command group.

Modules here keep their top-level imports light (typer, OmegaConf, the standard library, foxhunt's
errors and the store's location, tags and SQLite reader): torch, Lightning, MLflow, Hydra, pydantic,
rich and the rooms of the heavy commands are imported inside the commands that need them (class a
of docs/concepts/architecture.md, Imports; each module's ``# Lazy imports:`` line), so ``foxhunt
--help``, tab completion and the read-only commands answer fast.
"""
