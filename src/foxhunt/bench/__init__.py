"""foxhunt's benchmark: training throughput, inference latency and framework overhead, each
measured side by side with a peer library or the limit in one run (``scripts/benchmark.py``).

Modules: :mod:`~foxhunt.bench.rl` (PPO, DQN against Stable-Baselines3 and a bare loop),
:mod:`~foxhunt.bench.tft` (the TFT against pytorch-forecasting's), :mod:`~foxhunt.bench.latency`
(batch-1 CPU inference), :mod:`~foxhunt.bench.overhead` (foxhunt-train against a plain loop),
:mod:`~foxhunt.bench.report` (markdown and JSON), :mod:`~foxhunt.bench.run` (the CLI), with
:mod:`~foxhunt.bench.settings`, :mod:`~foxhunt.bench.context` and :mod:`~foxhunt.bench.measure`
shared. Settings: ``conf/bench/default.yaml``.
"""
