"""The cells of a sweep, as Hydra's basic sweeper expands them: the cartesian product of the
comma lists. Written once, for the job launcher (which plans a job before starting it) and for
the packing (which estimates each cell before the launcher exists).

Hydra has no public API for it: :class:`BasicSweeper` is in ``hydra._internal``, pinned by
``hydra-core<1.4`` (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser


def expand_grid(arguments: Sequence[str], config_loader=None) -> list[list[str]]:
    """The override list of every job of ``arguments`` (sweeper params and command-line
    overrides), in the order Hydra's basic sweeper launches them."""
    parser = OverridesParser.create(config_loader=config_loader)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(overrides=list(arguments)), max_batch_size=None)
    return [cell for batch in batches for cell in batch]
