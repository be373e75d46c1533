"""Paper trading: the registered ensemble on a live or replayed bar feed, with orders, fills, a
crash-safe ledger and risk limits (``foxhunt ensemble paper``, docs/how-to/paper.md)."""
