"""Sub-commands of the ``foxhunt`` CLI, one module per command group.

Modules here keep their top-level imports light (typer, the standard library): torch,
lightning and mlflow are imported inside the commands that need them, so read-only commands
answer fast.
"""
