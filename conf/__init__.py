"""Hydra configuration tree of foxhunt (src/foxhunt/conf links here; ships inside the wheel)."""
