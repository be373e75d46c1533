"""The trading room: what holding one futures contract earns and costs, and the simulator that trades it.

* :mod:`foxhunt.trading.pnl`: the one owner of the cost and PnL formula (the per-contract cost,
  the held contract's move across a roll, the roll bars, one step's gross PnL, costs and net
  PnL), on numpy arrays and torch tensors alike; the env, the agents' greedy walk, the backtest
  and the paper fills all call it.
* :mod:`foxhunt.trading.env`: the vectorized trading environment the RL agents step (torch),
  and its gymnasium wrappers.

It reads only arrays and the asset's contract figures: it knows no data source, model, job,
command line, training room, sweep, ensemble, benchmark or paper account.
"""
