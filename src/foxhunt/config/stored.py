"""Configs read back from a store: checked before anything they name is imported or built.

A run's resolved ``config.yaml`` (a run's artifact, a registered version's file) and a job's
stored overrides (tags of its parent run) come from places other people can write: a shared
artifact store, a registry database. Rebuilding from them with Hydra's ``instantiate`` would
import and call whatever a ``_target_`` names, and the schema itself imports the model's and
the source's ``_target_`` to check their arguments, so the checks here run first:

- **Targets.** Every ``_target_`` of a stored config must be one that foxhunt's own ``conf/``
  places at that key (``model.module`` may be ``foxhunt.models.dqn.DQNAgent``, never
  ``os.system``): the allowlist is read from the packaged ``conf/`` files
  (:func:`conf_targets`), so a new model family or source is allowed by its config file alone.
  Hydra's other special keys (``_args_``, ``_partial_``, ...) are refused where ``conf/`` has
  none.
- **No interpolation.** A stored config is resolved when it is written: a ``${...}`` in it
  (``${oc.env:DATABENTO_API_KEY}`` copying a secret into logged params) is refused.
- **Stored overrides** (a job's resume) may set plain values and pick group options, never a
  ``_target_``, a logging class, Hydra's search path, callbacks or launcher set-up, shell lines
  (``strategy.setup``) or an interpolation, and of Hydra's own settings only the sweeper's, the
  sweep folder and which sweeper or launcher runs (``hydra.job.env_set`` would set environment
  variables the programs a run starts act on: :func:`check_stored_overrides`).

Each refusal is one line naming where the config came from and the key. The user's own command
line and config files are another trust domain: they are not checked here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from foxhunt.errors import ConfigError
from foxhunt.files import read_regular_file

# Lazy imports: (c) Hydra's override parser in _parsed_value: foxhunt train stop imports jobs.launch, which imports this module

TARGET = "_target_"
#: The first line of a config file that puts its keys at another package than its group's.
_PACKAGE_HEADER = re.compile(r"^#\s*@package\s+(\S+)")
_WHOLE_REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")
#: Keys of Python's logging config (Hydra's job_logging) that import a class or call a factory.
_CODE_KEYS = frozenset({TARGET, "class", "()", "setup"})
#: Hydra settings an override read from a store may never touch: they add config search paths,
#: callbacks, logging handlers, or shell lines run before each job.
_CODE_PREFIXES = ("hydra.searchpath", "hydra.callbacks", "hydra.job_logging", "hydra.hydra_logging",
                  "hydra.launcher.setup", "hydra/job_logging", "hydra/hydra_logging", "hydra/callbacks", "strategy.setup")  # fmt: skip
#: Hydra's own settings a stored override may set: the sweeper's (a search's trials, its study)
#: and the sweep's folder, and which sweeper or launcher runs. Any other (``hydra.job.env_set``
#: puts variables in the environment of every program the run starts: a ``GIT_CONFIG_*`` there
#: made the run's own ``git diff`` run a shell line; ``hydra.run.dir``, ``hydra.job.chdir``, ...)
#: is refused.
_STORED_HYDRA = ("hydra.sweeper.", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.launcher.n_jobs", "hydra/sweeper",
                 "hydra/launcher")  # fmt: skip
#: Command-line flags that add a config folder or pick another primary config.
_CODE_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "--experimental-rerun")


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every (dotted key, mapping or leaf) under ``node``, lists indexed."""
    yield path, node
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}.{index}" if path else str(index))


@functools.cache
def conf_targets() -> frozenset[tuple[str, str]]:
    """(key, class) of every ``_target_`` in foxhunt's packaged ``conf/`` files: the key is where
    Hydra puts the node (the file's group, or its ``@package``), e.g.
    ``("model.module", "foxhunt.models.dqn.DQNAgent")``; interpolated targets are skipped."""
    found: set[tuple[str, str]] = set()
    aliases: set[tuple[str, str]] = set()  # (key, the key it interpolates whole: ``budget: ${budget}``)
    root = resources.files("foxhunt.conf")
    for entry, folders in _yaml_files(root, ()):
        text = entry.read_text()
        header = next((m.group(1) for line in text.splitlines()[:3] if (m := _PACKAGE_HEADER.match(line))), None)
        group = ".".join(folders)
        package = "" if header == "_global_" or not group else (header if header not in (None, "_group_") else group)
        for key, node in _walk(yaml.safe_load(text) or {}, package):
            if isinstance(node, Mapping) and isinstance(node.get(TARGET), str) and "${" not in node[TARGET]:
                found.add((key, node[TARGET]))
            elif isinstance(node, str) and (whole := _WHOLE_REFERENCE.match(node)):
                aliases.add((key, whole.group(1)))
    while True:  # a resolved config holds the referenced node's targets at the referring key too
        more = {(key + at[len(ref):], target) for key, ref in aliases for at, target in found
                if at == ref or at.startswith(ref + ".")} - found  # fmt: skip
        if not more:
            return frozenset(found)
        found |= more


def _yaml_files(folder, parts: tuple[str, ...]) -> Iterator[tuple[Any, tuple[str, ...]]]:
    """Every packaged config file under ``folder`` with its group folders."""
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir() and not entry.name.startswith(("_", ".")):
            yield from _yaml_files(entry, (*parts, entry.name))
        elif entry.name.endswith(".yaml"):
            yield entry, parts


def check_stored_config(config: Mapping[str, Any], origin: str) -> None:
    """Refuse a stored config (plain containers, as :func:`load_stored_config` reads it) that
    names a class ``conf/`` does not place at that key, uses another Hydra special key, or holds
    an interpolation; raise :class:`ConfigError` naming ``origin`` and the key."""
    allowed = conf_targets()
    for key, node in _walk(config, ""):
        if isinstance(node, str) and "${" in node:
            raise ConfigError(f"{origin}: {key}={_shown(node)}: a stored config is resolved; an interpolation in it is refused")
        if not isinstance(node, Mapping):
            continue
        for special in (k for k in node if isinstance(k, str) and k.startswith("_") and k.endswith("_") and k != TARGET):
            where = f"{key}.{special}" if key else special
            raise ConfigError(f"{origin}: {where}: Hydra's {special} is not in foxhunt's configs; refused")
        target = node.get(TARGET)
        if target is None:
            continue
        if not isinstance(target, str) or (key, target) not in allowed:
            known = sorted(t for k, t in allowed if k == key)
            rule = f"conf/ puts {', '.join(known)} there" if known else "conf/ puts no class there"
            raise ConfigError(f"{origin}: {key}.{TARGET}={_shown(target)}: not one of foxhunt's own classes for this key "
                              f"({rule}); refused, nothing imported")  # fmt: skip


MAX_STORED_CONFIG_BYTES = 16 * 1024 * 1024  # a resolved run config is a few KB; a larger file is not one


class _PlainYaml(yaml.SafeLoader):
    """YAML without anchors and aliases: foxhunt writes none (omegaconf's dumper ignores them),
    and nested aliases are an exponential expansion (a "billion laughs" file of a few hundred
    bytes held a reproduce at 100% CPU past 90 s)."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            what = "an alias (*name)" if isinstance(event, yaml.AliasEvent) else "an anchor (&name)"
            raise yaml.composer.ComposerError(None, None, f"{what}: a stored config holds none", event.start_mark)
        return super().compose_node(parent, index)


def load_stored_config(path: Path, origin: str):
    """The stored config at ``path`` as a DictConfig, checked (:func:`check_stored_config`)
    before omegaconf or Hydra sees it: a regular file of at most :data:`MAX_STORED_CONFIG_BYTES`,
    plain YAML (no anchor or alias); a file that is not a YAML mapping is one line."""
    name = Path(path).name
    try:
        text = read_regular_file(path, MAX_STORED_CONFIG_BYTES)
        if text is None:
            raise ConfigError(f"{origin}: {name} is not a config (not a regular file of at most {MAX_STORED_CONFIG_BYTES} bytes)")
        data = yaml.load(text.decode(), Loader=_PlainYaml)  # noqa: S506  (a SafeLoader: plain values only)
    except RecursionError:
        raise ConfigError(f"{origin}: {name} is not a config (nested too deep)") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{origin}: {name} is not readable YAML ({' '.join(str(exc).split())[:160]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: {name} is not a config (not a YAML mapping)")
    check_stored_config(data, origin)
    return OmegaConf.create(data)


def check_stored_overrides(overrides: Sequence[str], origin: str) -> None:
    """Refuse stored Hydra overrides that could name code or read the environment (module doc):
    their keys, and every key inside their values (a dict value, a sweep's options), read by
    Hydra's own override parser; the searched keys of ``hydra.sweeper.params`` are overrides of
    each trial, checked as stored overrides themselves (a ``+hydra.job.env_set.GIT_CONFIG_*`` key
    there ran a shell line through the trial's ``git diff``: found by a helper probing resume)."""
    for item in overrides:
        text = str(item)
        if text.split("=", 1)[0] in _CODE_FLAGS or text.startswith(tuple(f"{flag}=" for flag in _CODE_FLAGS)):
            raise ConfigError(f"{origin}: stored override {_shown(text)}: adds a config folder; refused")
        if "${" in text:
            raise ConfigError(f"{origin}: stored override {_shown(text)}: an interpolation read from a store is refused")
        key = text.partition("=")[0]
        _check_key(key, text, origin)
        value = _parsed_value(text, origin)
        bare = key.lstrip("+~")
        if bare == _SEARCHED or bare.startswith(_SEARCHED + "."):
            searched = value if bare == _SEARCHED else {bare[len(_SEARCHED) + 1 :]: value}
            if not isinstance(searched, Mapping | None):
                raise ConfigError(
                    f"{origin}: stored override {_shown(text)}: {_SEARCHED} must map keys to searched values; refused"
                )
            for param, options in (searched or {}).items():
                _check_key(str(param), text, origin)
                _check_value(_parsed_value(f"{param}={options}", origin) if isinstance(options, str) else options, text, origin)
        else:
            _check_value(value, text, origin)


_SEARCHED = "hydra.sweeper.params"  # its keys are overrides of each trial


def _check_key(key: str, text: str, origin: str) -> None:
    bare = key.lstrip("+~")
    parts = re.split(r"[./]", bare)
    if (
        any(part in _CODE_KEYS for part in parts)
        or bare.startswith(_CODE_PREFIXES)
        or bare.replace("/", ".").startswith(_CODE_PREFIXES)
    ):
        raise ConfigError(f"{origin}: stored override {_shown(text)}: it can name code to run "
                          "(a class, a callback, a search path, shell lines); refused")  # fmt: skip
    if parts[0] == "hydra" and not any(bare == allowed or bare.startswith(allowed) for allowed in _STORED_HYDRA):
        raise ConfigError(f"{origin}: stored override {_shown(text)}: of Hydra's own settings a stored override may set "
                          "only the sweeper's, the sweep folder and which sweeper or launcher runs; refused")  # fmt: skip


def _parsed_value(text: str, origin: str) -> Any:
    """The value of the override ``text`` as Hydra's parser reads it (a dict, a list, a sweep)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(text).value()
    except (HydraException, RecursionError, ValueError) as exc:
        raise ConfigError(f"{origin}: stored override {_shown(text)}: not an override Hydra parses "
                          f"({type(exc).__name__}); refused") from None  # fmt: skip


def _check_value(value: Any, text: str, origin: str) -> None:
    """Refuse a value holding a key that can name code (``_target_``, a logging ``class``, any
    of Hydra's ``_special_`` keys), at any depth of its dicts, lists and sweep options."""
    for _key, node in _walk(_plain(value), ""):
        if not isinstance(node, Mapping):
            continue
        for inner in map(str, node):
            parts = re.split(r"[./]", inner.lstrip("+~"))
            if any(part in _CODE_KEYS or (part.startswith("_") and part.endswith("_") and len(part) > 1) for part in parts):
                raise ConfigError(f"{origin}: stored override {_shown(text)}: its value holds {inner!r}, which can name "
                                  "code to run; refused")  # fmt: skip


def _plain(value: Any) -> Any:
    """A parsed override value with its sweeps' options as lists (a choice's, a glob's)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    options = getattr(value, "list", None)
    return [_plain(v) for v in options] if isinstance(options, list) else value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
