"""The rolling loop: new bars found, challengers trained through :mod:`foxhunt.training`,
champion against challenger on bars neither has seen, promotion through the registry
(:mod:`foxhunt.ensemble.registry`). ``foxhunt ensemble roll | rollback``; docs/how-to/roll.md."""
