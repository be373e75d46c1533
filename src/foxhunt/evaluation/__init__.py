"""Backtest shared by all models: PnL, Sharpe, drawdown, hit rate, turnover, equity plots."""

from foxhunt.evaluation.backtest import BacktestResult, backtest
from foxhunt.evaluation.plots import plot_equity

__all__ = ["BacktestResult", "backtest", "plot_equity"]
