"""``foxhunt runs reproduce``: is a run's result what its inputs give, and if not, which input moved?

The command (:mod:`foxhunt.commands.runs`) retrains the run from its stored config
(:mod:`foxhunt.training.reproduce`); this module reads the original before anything trains
(:func:`open_original`) and compares the two runs afterwards (:func:`compare`).

**Before training** (:func:`open_original`; each failure one line, exit 2): the run exists, is
FINISHED and is one training (a cell made of folds or seeds is reproduced one child at a time);
its ``config.yaml`` artifact passes :func:`foxhunt.config.stored.load_stored_config` (a
``_target_`` that ``conf/`` does not place at that key is refused before anything is imported);
it logged a ``checkpoints/best.ckpt`` or ``checkpoints/last.ckpt`` that loads with
``torch.load(weights_only=True)`` as a state dict; its provenance files
(:mod:`foxhunt.runs.provenance`) are foxhunt's JSON. A run trained before provenance was
recorded has none: its inputs are said not recorded, its results still compared.

**Results.** *Weights*: every checkpoint of ``best.ckpt`` and ``last.ckpt`` the original
logged, against the reproduction's of the same name: the same tensor names, and each pair equal
by ``torch.equal`` (dtype, shape and every value). *Metrics*: every metric the original logged,
at every step, equal to the reproduction's (NaN equal to NaN), and none logged by one run
only, except those that measure the machine rather than the training, which two runs never
share (:func:`metric_excluded`): ``memory/*`` (the process's and the device's memory, the
memory callback's own overhead), ``progress``, and any name ending in ``_per_s``, ``_s`` or
``_ms`` (throughput and durations, e.g. ``train/env_steps_per_s``). The verdict lists which were
excluded. **Identical** means both: the weights and every compared metric equal.

**Inputs**, compared in this order, the original's first attempt first (then each resumed
attempt's, ``provenance/resumed-<N>``): the data (the source's settings; each file, by path: old
and new SHA-256; each split's bars), the code (the package files; with the commits and whether
the uncommitted diff differs), the packages (Python, then each distribution: name and both
versions), the device (CPU or CUDA device, torch's threads, the deterministic settings).

**The verdict** (first line, then indented details; ``--json`` gives the same as one object):

- ``identical: ...`` (exit 0), with a line ``inputs differ: ...`` when the results came out
  equal although an input moved (a package's version, another CPU model);
- ``differs: <the first input that differs>`` (exit 1), e.g. ``differs: data: file
  /data/es.csv: sha256 3f2a... (original) -> 9c41... (reproduction)``, or ``differs: no recorded
  input differs, yet <the first result that differs>`` when the training itself was not
  deterministic; the details name the first weight tensor and the first metric and step that
  differ.

Determinism is promised on CPU. On CUDA it holds only with ``trainer.deterministic=true``
(Lightning then calls ``torch.use_deterministic_algorithms(True)`` and sets
``CUBLAS_WORKSPACE_CONFIG=:4096:8``) and where every kernel the model uses has a deterministic
implementation; the verdict's ``determinism`` line says which case the reproduction was in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from mlflow.exceptions import MlflowException

from foxhunt.config.schema import validate
from foxhunt.config.stored import load_stored_config
from foxhunt.errors import ConfigError, UserError
from foxhunt.runs.checkpoints import BEST_CHECKPOINT, CHECKPOINT_ARTIFACTS, LAST_CHECKPOINT
from foxhunt.runs.liveness import run_state
from foxhunt.runs.provenance import (
    CODE_FILE,
    DATA_FILE,
    DEVICE_FILE,
    ENVIRONMENT_FILE,
    PROVENANCE_FILES,
    PROVENANCE_FOLDER,
    PROVENANCE_VERSION,
    RESUMED_PREFIX,
)
from foxhunt.runs.status import Status
from foxhunt.runs.store import is_version_number
from foxhunt.runs.stored import StoredRun
from foxhunt.runs.tags import REPRODUCTIONS_EXPERIMENT, ROLE_CELL, Tag
from foxhunt.runs.tracked_run import CONFIG_ARTIFACT

VERDICT_ARTIFACT = "reproduction.txt"  # the verdict's lines, on the reproduction's run
COMPARED_CHECKPOINTS = (BEST_CHECKPOINT, LAST_CHECKPOINT)
# memory: the process's RSS, the device's peaks, the callback's overhead; system: MLflow's samples of the machine
EXCLUDED_PREFIXES = ("memory/", "system/")
EXCLUDED_NAMES = ("progress",)  # the progress callback's fraction (what foxhunt train watch draws)
EXCLUDED_SUFFIXES = ("_per_s", "_s", "_ms")  # throughput and durations
EXIT_IDENTICAL, EXIT_DIFFERS = 0, 1
FIRST_ATTEMPT = "original"
MORE_SHOWN = 1  # packages named per verdict line; the rest counted
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ReproduceError(UserError):
    """The reproduction cannot start: one line naming the run and what is missing or refused."""


def metric_excluded(key: str) -> bool:
    """True for a metric that measures the machine, not the training (module doc)."""
    return key.startswith(EXCLUDED_PREFIXES) or key in EXCLUDED_NAMES or key.endswith(EXCLUDED_SUFFIXES)


def excluded_summary(keys: list[str]) -> str:
    """The excluded metrics in words: ``memory/* (13), progress, train/env_steps_per_s``."""
    parts = [f"{prefix}* ({n})" for prefix in EXCLUDED_PREFIXES if (n := sum(k.startswith(prefix) for k in keys))]
    return ", ".join(parts + [k for k in keys if not k.startswith(EXCLUDED_PREFIXES)])


def resolve_target(store, target: str) -> str:
    """The run id ``target`` names: a run id, or a registered version (``models:/NAME@ALIAS``,
    ``models:/NAME/VERSION``): the run whose weights it registered."""
    if not target.startswith("models:"):
        return target
    match = _MODELS_URI.match(target)
    if match is None:
        raise ReproduceError(f"{target}: not a run id, models:/NAME@ALIAS or models:/NAME/VERSION")
    name, alias, version = match.group("name"), match.group("alias"), match.group("version")
    if version and not is_version_number(version):  # no store holds one; SQLite's integer overflowed ('cannot read the store')
        raise ReproduceError(f"{target}: no such registered version in {store.tracking_uri}")
    found = store.get_version(name, version) if version else store.get_version_by_alias(name, alias)
    if found is None:
        raise ReproduceError(f"{target}: no such registered version in {store.tracking_uri}")
    run_id = found.tags.get("weights_run_id") or found.run_id or found.tags.get("run_id")
    if not run_id:
        raise ReproduceError(f"{target}: version {found.version} names no training run")
    return str(run_id)


@dataclass
class Original:
    """The run to reproduce, read and checked before anything trains."""

    run: StoredRun
    config: Any  # DictConfig, checked by load_stored_config
    config_path: Path  # its config.yaml as downloaded
    checkpoints: dict[str, Path]  # name (best.ckpt, last.ckpt) -> downloaded file
    provenance: dict[str, dict[str, dict]]  # attempt -> provenance file name -> content

    @property
    def threads(self) -> int | None:
        device: dict = next((files[DEVICE_FILE] for files in reversed(self.attempts()) if DEVICE_FILE in files), {})
        threads = device.get("torch_threads")
        return threads if isinstance(threads, int) and not isinstance(threads, bool) else None

    def attempts(self) -> list[dict[str, dict]]:
        """The provenance files of each attempt, first to last (resumed-2 before resumed-10): the
        threads are the last attempt's that recorded a device (a killed first attempt never logs
        device.json, which is written as its training ends: a resumed run was retrained with the
        machine's default threads, found by a helper probing kill and resume)."""

        def order(attempt: str) -> tuple[int, int]:
            number = attempt.removeprefix(RESUMED_PREFIX)
            return (0, 0) if attempt == FIRST_ATTEMPT else (1, int(number) if number.isdigit() else 0)

        return [self.provenance[a] for a in sorted(self.provenance, key=order)]

    def recorded(self) -> set[str]:
        """The provenance files any attempt recorded."""
        return {name for files in self.provenance.values() for name in files}


def open_original(store, run_id: str, workdir: Path) -> Original:
    """The run ``run_id`` with its config, checkpoints and provenance, checked (module doc)."""
    run = _get_run(store, run_id)
    origin = f"run {run_id} ({run.name})"
    if run.status != Status.FINISHED:
        state = run_state(run)  # a run killed by kill -9 is RUNNING in the store: said as what it is
        why = (" (RUNNING in the store, its process gone: finish it with resume=true, then reproduce it)"
               if state == Status.STALE else "")  # fmt: skip
        raise ReproduceError(f"{origin} is {state}{why}: only a FINISHED run has results to reproduce")
    if run.tags.get(Tag.ROLE) == ROLE_CELL:
        raise ReproduceError(f"{origin} is a cell of folds or seeds (tag {Tag.ROLE}={ROLE_CELL}): reproduce each of its runs "
                             f"(tag {Tag.PARENT}={run_id})")  # fmt: skip
    if run.tags.get(Tag.REPRODUCTION_OF):
        raise ReproduceError(f"{origin} is itself a reproduction of run {run.tags[Tag.REPRODUCTION_OF]}: reproduce that run")
    root = workdir / "original"
    if CONFIG_ARTIFACT not in store.logged_files(run_id, ""):
        raise ReproduceError(f"{origin}: no {CONFIG_ARTIFACT} artifact: nothing to retrain it from")
    config_path = Path(store.download(run_id, CONFIG_ARTIFACT, root))
    config = load_stored_config(config_path, f"{origin}: {CONFIG_ARTIFACT}")
    try:  # checked here, so a refusal names the file (the retrain's own said only 'config error: task: missing')
        validate(config)
    except ConfigError as exc:
        raise ReproduceError(f"{origin}: {CONFIG_ARTIFACT}: {str(exc).strip().splitlines()[0]}") from None
    logged = set(store.logged_files(run_id, CHECKPOINT_ARTIFACTS))
    names = [name for name in COMPARED_CHECKPOINTS if name in logged]
    if not names:
        why = (f"its checkpoints were pruned ({run.tags[Tag.ARTIFACTS_PRUNED]})" if Tag.ARTIFACTS_PRUNED in run.tags
               else "logger.log_checkpoints=none?")  # fmt: skip
        raise ReproduceError(f"{origin}: no {CHECKPOINT_ARTIFACTS}/{BEST_CHECKPOINT} or {CHECKPOINT_ARTIFACTS}/{LAST_CHECKPOINT} "
                             f"artifact: no weights to compare a reproduction with ({why})")  # fmt: skip
    checkpoints = {}
    for name in names:
        path = store.download(run_id, f"{CHECKPOINT_ARTIFACTS}/{name}", root)
        state_dict(path, f"{origin}: {CHECKPOINT_ARTIFACTS}/{name}")  # loads, or one line
        checkpoints[name] = path
    return Original(run, config, config_path, checkpoints, read_provenance(store, run_id, root, origin))


def _get_run(store, run_id: str) -> StoredRun:
    try:
        return store.get(run_id)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise ReproduceError(f"run {run_id}: not in the store {store.tracking_uri}") from None
        raise


def read_provenance(store, run_id: str, destination: Path, origin: str) -> dict[str, dict[str, dict]]:
    """The run's provenance files per attempt (``original``, then ``resumed-*``), each checked."""
    folders = {FIRST_ATTEMPT: PROVENANCE_FOLDER}
    for item in store.client.list_artifacts(run_id, PROVENANCE_FOLDER):
        name = item.path.rsplit("/", 1)[-1]
        if item.is_dir and name.startswith(RESUMED_PREFIX):
            folders[name] = f"{PROVENANCE_FOLDER}/{name}"
    found: dict[str, dict[str, dict]] = {}
    for attempt, folder in folders.items():
        files = {}
        for name in set(store.logged_files(run_id, folder)) & set(PROVENANCE_FILES):
            path = store.download(run_id, f"{folder}/{name}", destination)
            files[name] = checked_provenance(path, f"{origin}: {folder}/{name}", name)
        found[attempt] = files
    return found


def checked_provenance(path: Path, origin: str, name: str) -> dict:
    """A provenance file read back from a store: JSON of foxhunt's layout, else one line."""
    try:
        content = json.loads(Path(path).read_text())
    except RecursionError:
        raise ReproduceError(f"{origin}: not readable JSON (nested too deep)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReproduceError(f"{origin}: not readable JSON ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(content, dict) or content.get("version") != PROVENANCE_VERSION:
        raise ReproduceError(f"{origin}: not foxhunt's provenance (version {PROVENANCE_VERSION} JSON object)")
    rules = {
        DATA_FILE: {"files": _files_list, "splits": _text_map, "digest": _hex},
        CODE_FILE: {
            "files": _text_map,
            "digest": _hex,
            "commit": _optional_text,
            "diff_sha256": _optional_text,
            "package_version": _optional_text,
        },  # fmt: skip
        ENVIRONMENT_FILE: {"packages": _text_map, "python": _text_map, "digest": _hex},
        DEVICE_FILE: {"device": _text, "name": _text},
    }[name]
    for key, rule in rules.items():
        if not rule(content.get(key)):
            raise ReproduceError(f"{origin}: {key}={str(content.get(key))[:80]!r} is not what foxhunt writes there")
    return content


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _optional_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _hex(value: Any) -> bool:
    return isinstance(value, str) and bool(_HEX64.match(value))


def _text_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _files_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(f, dict) and _text(f.get("path")) and _hex(f.get("sha256")) for f in value)


def state_dict(path: Path, origin: str) -> dict:
    """The checkpoint's ``state_dict`` (tensors by name), loaded with ``weights_only=True``."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever makes it unloadable is the file's fault
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
        raise ReproduceError(f"{origin}: not a loadable checkpoint ({why})") from None
    state = loaded.get("state_dict") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ReproduceError(f"{origin}: holds no state_dict of tensors")
    return state


# -- the comparison ---------------------------------------------------------------------------
@dataclass
class Verdict:
    """What :func:`compare` found (module doc)."""

    original: str
    original_name: str
    reproduction: str
    weights_compared: list[str] = field(default_factory=list)
    tensors: int = 0
    weight_difference: str | None = None
    metrics_compared: list[str] = field(default_factory=list)
    metrics_excluded: list[str] = field(default_factory=list)
    metric_difference: str | None = None
    inputs_differ: list[str] = field(default_factory=list)  # in order: data, code, packages, device
    not_recorded: list[str] = field(default_factory=list)  # provenance files the original lacks
    determinism: str = ""

    @property
    def identical(self) -> bool:
        return self.weight_difference is None and self.metric_difference is None and bool(self.weights_compared)

    @property
    def exit_code(self) -> int:
        return EXIT_IDENTICAL if self.identical else EXIT_DIFFERS

    def headline(self) -> str:
        if self.identical:
            text = f"identical: run {self.reproduction} reproduces run {self.original} ({self.original_name})"
            return text + (f", though an input differs: {self.inputs_differ[0]}" if self.inputs_differ else "")
        if self.inputs_differ:
            return f"differs: {self.inputs_differ[0]}"
        first = self.weight_difference or self.metric_difference
        return f"differs: no recorded input differs, yet {first}"

    def lines(self) -> list[str]:
        shown = ", ".join(f"{CHECKPOINT_ARTIFACTS}/{n}" for n in self.weights_compared)
        weights = f"differ: {self.weight_difference}" if self.weight_difference else f"equal ({shown}: {self.tensors} tensors)"
        metrics = (f"differ: {self.metric_difference}" if self.metric_difference
                   else f"{len(self.metrics_compared)} equal at every step")  # fmt: skip
        out = [self.headline(), f"  weights: {weights}", f"  metrics: {metrics}"]
        if self.metrics_excluded:
            out.append(f"  not compared (they measure time or memory): {excluded_summary(self.metrics_excluded)}")
        for difference in self.inputs_differ:
            out.append(f"  input differs: {difference}")
        if not self.inputs_differ:
            out.append("  inputs: the same data, code, packages and device" if not self.not_recorded
                       else "  inputs: the same where recorded")  # fmt: skip
        if self.not_recorded:
            out.append(f"  not recorded by the original (trained before foxhunt recorded them): {', '.join(self.not_recorded)}")
        out.append(f"  determinism: {self.determinism}")
        out.append(f"  reproduction: run {self.reproduction} in experiment {REPRODUCTIONS_EXPERIMENT}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "identical": self.identical, "verdict": self.headline()}


def compare(store, original: Original, reproduction_id: str, workdir: Path) -> Verdict:
    """Compare the reproduction's weights, metrics and inputs with the original's (module doc)."""
    run = original.run
    root = workdir / "reproduction"
    verdict = Verdict(run.run_id, run.name, reproduction_id)
    _compare_weights(store, original, reproduction_id, root, verdict)
    _compare_metrics(store, run.run_id, reproduction_id, verdict)
    again = read_provenance(store, reproduction_id, root, f"run {reproduction_id}").get(FIRST_ATTEMPT, {})
    recorded = original.recorded()  # a killed first attempt recorded what its resumed attempt did
    verdict.not_recorded = [f"{PROVENANCE_FOLDER}/{name}" for name in PROVENANCE_FILES if name not in recorded]
    for attempt, files in original.provenance.items():
        label = "" if attempt == FIRST_ATTEMPT else f" (the original's {attempt} attempt)"
        verdict.inputs_differ += [text + label for text in input_differences(files, again)]
    verdict.determinism = determinism(again.get(DEVICE_FILE))
    return verdict


def _compare_weights(store, original: Original, reproduction_id: str, root: Path, verdict: Verdict) -> None:
    logged = set(store.logged_files(reproduction_id, CHECKPOINT_ARTIFACTS))
    for name, path in original.checkpoints.items():
        if name not in logged:
            verdict.weight_difference = verdict.weight_difference or f"the reproduction logged no {CHECKPOINT_ARTIFACTS}/{name}"
            continue
        mine = state_dict(path, f"run {original.run.run_id}: {CHECKPOINT_ARTIFACTS}/{name}")
        theirs = state_dict(store.download(reproduction_id, f"{CHECKPOINT_ARTIFACTS}/{name}", root),
                            f"run {reproduction_id}: {CHECKPOINT_ARTIFACTS}/{name}")  # fmt: skip
        verdict.weights_compared.append(name)
        verdict.tensors = max(verdict.tensors, len(mine))
        if verdict.weight_difference is None:
            verdict.weight_difference = _first_tensor_difference(name, mine, theirs, torch)


def _first_tensor_difference(name: str, mine: Mapping, theirs: Mapping, torch) -> str | None:
    where = f"{CHECKPOINT_ARTIFACTS}/{name}"
    if set(mine) != set(theirs):
        only = sorted(set(mine) ^ set(theirs))[0]
        side = "original" if only in mine else "reproduction"
        return f"{where}: tensor {only!r} is in the {side}'s only"
    for key in mine:
        a, b = mine[key], theirs[key]
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: tensor {key!r} is {a.dtype} {tuple(a.shape)} (original), {b.dtype} {tuple(b.shape)} (reproduction)"
        if not torch.equal(a, b):
            gap = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else float("nan")
            return f"{where}: tensor {key!r} differs first (largest difference {gap:.3g})"
    return None


def metric_history(store, run_id: str, keys) -> dict[str, list[tuple[int, float]]]:
    """Every value of each metric, by step (then value), as the store holds them."""
    return {key: sorted(((int(m.step or 0), float(m.value)) for m in store.client.get_metric_history(run_id, key)), key=_order)
            for key in keys}  # fmt: skip


def _order(point: tuple[int, float]) -> tuple[int, int, float]:
    step, value = point
    return (step, 1, 0.0) if math.isnan(value) else (step, 0, value)


def _compare_metrics(store, original_id: str, reproduction_id: str, verdict: Verdict) -> None:
    a_keys, b_keys = set(_run_metrics(store, original_id)), set(_run_metrics(store, reproduction_id))
    keys = sorted(a_keys | b_keys)
    verdict.metrics_excluded = [k for k in keys if metric_excluded(k)]
    compared = [k for k in keys if not metric_excluded(k)]
    verdict.metrics_compared = compared
    only = [k for k in compared if (k in a_keys) != (k in b_keys)]
    if only:
        side = "original" if only[0] in a_keys else "reproduction"
        verdict.metric_difference = f"metric {only[0]} was logged by the {side} only"
        return
    a, b = metric_history(store, original_id, compared), metric_history(store, reproduction_id, compared)
    firsts = []
    for key in compared:
        for i in range(max(len(a[key]), len(b[key]))):
            x = a[key][i] if i < len(a[key]) else None
            y = b[key][i] if i < len(b[key]) else None
            if x is None or y is None or x[0] != y[0] or not _same(x[1], y[1]):
                step = min(p[0] for p in (x, y) if p is not None)
                firsts.append((step, key, x, y))
                break
    if firsts:
        step, key, x, y = min(firsts, key=lambda f: (f[0], f[1]))
        shown = [("-" if p is None else f"{p[1]!r} at step {p[0]}") for p in (x, y)]
        verdict.metric_difference = (
            f"metric {key} differs first at step {step}: {shown[0]} (original) -> {shown[1]} (reproduction)"
        )


def _run_metrics(store, run_id: str) -> list[str]:
    return list(store.get(run_id).metrics)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# -- inputs -----------------------------------------------------------------------------------
def input_differences(original: Mapping[str, dict], now: Mapping[str, dict]) -> list[str]:
    """What differs between two runs' provenance files, in order: data, code, packages, device
    (the first difference of each, files missing on either side skipped)."""
    found = []
    for name, differ in ((DATA_FILE, data_differences), (CODE_FILE, code_differences),
                         (ENVIRONMENT_FILE, package_differences), (DEVICE_FILE, device_differences)):  # fmt: skip
        if name in original and name in now:
            found += differ(original[name], now[name])
    return found


def data_differences(a: dict, b: dict) -> list[str]:
    if a.get("source") != b.get("source") or a.get("settings") != b.get("settings"):
        keys = sorted(k for k in set(a.get("settings") or {}) | set(b.get("settings") or {})
                      if (a.get("settings") or {}).get(k) != (b.get("settings") or {}).get(k))  # fmt: skip
        return [f"data: the source's settings differ ({', '.join(keys) or a.get('source')})"]
    files_a = {f["path"]: f["sha256"] for f in a["files"]}
    files_b = {f["path"]: f["sha256"] for f in b["files"]}
    for path in sorted(files_a.keys() | files_b.keys()):
        if path not in files_b:
            return [f"data: file {path} was read by the original, not by the reproduction"]
        if path not in files_a:
            return [f"data: file {path} is read now, not by the original"]
        if files_a[path] != files_b[path]:
            return [f"data: file {path}: sha256 {files_a[path]} (original) -> {files_b[path]} (reproduction)"]
    for split in sorted(a["splits"].keys() | b["splits"].keys()):
        if a["splits"].get(split) != b["splits"].get(split):
            what = "every file the same" if files_a else "the same source settings"
            return [f"data: the {split} split's bars: sha256 {a['splits'].get(split)} (original) -> {b['splits'].get(split)} "
                    f"(reproduction), with {what} (the features' code or a package differs)"]  # fmt: skip
    return []


def code_differences(a: dict, b: dict) -> list[str]:
    if a["digest"] == b["digest"]:
        return []
    names = sorted(a["files"].keys() | b["files"].keys())
    first = next(n for n in names if a["files"].get(n) != b["files"].get(n))
    change = ("added" if first not in a["files"] else "removed" if first not in b["files"]
              else f"sha256 {a['files'][first][:12]}... -> {b['files'][first][:12]}...")  # fmt: skip
    count = sum(1 for n in names if a["files"].get(n) != b["files"].get(n))
    text = f"code: {first} {change}" + (f" (and {count - 1} more files)" if count > 1 else "")
    if a.get("commit") != b.get("commit"):
        text += f"; commit {a.get('commit') or 'none'} (original) -> {b.get('commit') or 'none'} (reproduction)"
    elif a.get("commit"):
        text += f"; the same commit {a['commit']}"
    if a.get("diff_sha256") != b.get("diff_sha256"):
        text += "; the uncommitted diff differs" + ("" if a.get("diff_sha256") and b.get("diff_sha256") else
                                                    f" ({'none' if not a.get('diff_sha256') else 'one'} -> "
                                                    f"{'none' if not b.get('diff_sha256') else 'one'})")  # fmt: skip
    if a.get("package_version") != b.get("package_version"):
        text += f"; foxhunt {a.get('package_version')} -> {b.get('package_version')}"
    return [text]


def package_differences(a: dict, b: dict) -> list[str]:
    found = []
    if a["python"] != b["python"]:
        found.append(f"python {a['python'].get('version')} (original) -> {b['python'].get('version')} (reproduction)")
    names = sorted(n for n in a["packages"].keys() | b["packages"].keys() if a["packages"].get(n) != b["packages"].get(n))
    if names:
        shown = [f"package {n} {a['packages'].get(n, 'not installed')} (original) -> {b['packages'].get(n, 'not installed')} "
                 "(reproduction)" for n in names[:MORE_SHOWN]]  # fmt: skip
        more = len(names) - MORE_SHOWN
        found.append("; ".join(shown) + (f" (and {more} more packages)" if more > 0 else ""))
    return found


DEVICE_KEYS = (("torch_threads", "torch threads"), ("deterministic_algorithms", "deterministic algorithms"),
               ("cudnn_deterministic", "cudnn.deterministic"), ("cudnn_benchmark", "cudnn.benchmark"),
               ("cublas_workspace_config", "CUBLAS_WORKSPACE_CONFIG"), ("cuda_version", "CUDA"))  # fmt: skip


def device_differences(a: dict, b: dict) -> list[str]:
    found = []
    if (a["device"], a["name"]) != (b["device"], b["name"]):
        found.append(f"device: {a['device']}: {a['name']} (original) -> {b['device']}: {b['name']} (reproduction)")
    for key, label in DEVICE_KEYS:
        if a.get(key) != b.get(key):
            found.append(f"device: {label} {a.get(key)} (original) -> {b.get(key)} (reproduction)")
    return found[:1]


def determinism(device: dict | None) -> str:
    """What determinism the reproduction's device promised (module doc)."""
    if not device:
        return "unknown (the reproduction recorded no device)"
    if device.get("device") == "cpu":
        return f"CPU ({device.get('name')}): promised (the same data, code, packages and threads give the same weights)"
    if device.get("device") == "cuda":
        workspace = device.get("cublas_workspace_config")
        if device.get("deterministic_algorithms") and workspace in (":4096:8", ":16:8"):
            return (f"CUDA ({device.get('name')}): deterministic algorithms on (torch.use_deterministic_algorithms, "
                    f"CUBLAS_WORKSPACE_CONFIG={workspace}): equal where every kernel has a deterministic implementation")  # fmt: skip
        if device.get("deterministic_algorithms"):
            return (
                f"CUDA ({device.get('name')}): deterministic algorithms on but CUBLAS_WORKSPACE_CONFIG unset: cuBLAS may differ"
            )
        return (f"CUDA ({device.get('name')}): deterministic algorithms off (trainer.deterministic="
                f"{device.get('trainer_deterministic')}): equal weights are not promised")  # fmt: skip
    return f"{device.get('device')}: not promised"
