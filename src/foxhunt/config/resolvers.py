"""OmegaConf resolvers of foxhunt's configs (registered when ``foxhunt`` is imported).

``${foxhunt.run_suffix:}``: a token unique to this process (random, fixed for the process's
life). Hydra's ``${now:...}`` has a resolution of one second, so two runs started in the same
second would share an output folder (their checkpoints and reports with it); the run and sweep
folders of ``conf/hydra/default.yaml`` end with this token, so no two processes get the same
folder. A sweep's jobs are told apart within its folder by ``${hydra.job.num}``.
"""

from __future__ import annotations

import secrets

from omegaconf import OmegaConf

RUN_SUFFIX = "foxhunt.run_suffix"
SUFFIX_BYTES = 4  # 8 hex digits: a collision between two processes is one in 4 billion

_suffix: str | None = None


def run_suffix() -> str:
    """This process's folder token (see the module doc)."""
    global _suffix
    if _suffix is None:
        _suffix = secrets.token_hex(SUFFIX_BYTES)
    return _suffix


def register_resolvers() -> None:
    """Register the resolvers above with OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver(RUN_SUFFIX):
        # cached like Hydra's ${now:}: a sweep's jobs, resolved in other processes, see the parent's value
        OmegaConf.register_new_resolver(RUN_SUFFIX, run_suffix, use_cache=True)
