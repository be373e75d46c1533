"""The cells of a sweep, as Hydra's basic sweeper expands them: the cartesian product of the
comma lists. Written once, for the job launcher (which plans a job before starting it), for the packing
(which estimates each cell before the launcher exists) and for :func:`check_cells` (every cell's
values checked before the first one trains).

Hydra has no public API for it: :class:`BasicSweeper` is in ``hydra._internal``, pinned by
``hydra-core<1.4`` (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, open_dict

from foxhunt.config.schema import validate
from foxhunt.errors import ConfigError, one_line_error


def expand_grid(arguments: Sequence[str], config_loader=None) -> list[list[str]]:
    """The override list of every job of ``arguments`` (sweeper params and command-line
    overrides), in the order Hydra's basic sweeper launches them."""
    parser = OverridesParser.create(config_loader=config_loader)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(overrides=list(arguments)), max_batch_size=None)
    return [cell for batch in batches for cell in batch]


def check_cells(config: DictConfig, cells: Sequence[Sequence[str]], config_loader) -> None:
    """Every cell of a grid composed as its job will be and its values checked (the schema's
    :func:`foxhunt.config.schema.validate`, the same check each job makes first), before any
    run, worker or cell exists: a bad value in the last cell of a sweep failed that cell only,
    after the others had trained. One line naming the cell and the key."""
    for number, overrides in enumerate(cells):
        where = f"in cell [{' '.join(overrides) or '(defaults)'}] ({number + 1} of {len(cells)})"
        try:
            cell = config_loader.load_sweep_config(config, list(overrides))
        except Exception as exc:  # Hydra's own errors: an option that does not exist, an override it cannot apply
            if not type(exc).__module__.startswith(("hydra", "omegaconf")):
                raise
            raise ConfigError(f"{where}: {one_line_error(exc, with_type=False, first_line=True, limit=400)}") from None
        with open_dict(cell):  # the job's folder is Hydra's to make when the job starts: its sweep's, to check the rest
            cell.paths.output_dir = str(config.hydra.sweep.dir)
        try:
            validate(cell)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
