"""The ensemble: the best run of each model family registered in MLflow, loaded together, scoring
bars one at a time (registry, members, streaming engine, rules, replay)."""
