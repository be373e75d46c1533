"""The environment a registered member's MLflow model rebuilds in, offline from the model alone.

A version's ``requirements.txt`` names foxhunt as a wheel inside the model
(``artifacts/foxhunt-<version>-py3-none-any.whl``; MLflow's virtualenv and uv env-managers
install requirement paths relative to the model folder) and pins every dependency foxhunt
declares to the version installed where it was registered, so ``mlflow models serve
--env-manager virtualenv``, ``mlflow models build-docker`` or a plain ``pip install -r
requirements.txt`` rebuild the environment it was checked in, from any package index that has
those releases. Local version labels are dropped (``torch==2.13.0``, not ``2.13.0+cpu``: the
pin then matches the CPU or the CUDA build the index offers).

Where the wheel comes from, by how foxhunt was installed (its ``direct_url.json``, PEP 610):

- from a source folder (``pip install -e .``, ``pip install .``): built from a copy of that
  folder with its own build backend (``pip wheel --no-deps --no-build-isolation``;
  a copy, so a stale ``build/`` folder of the checkout cannot leak old modules into it);
- from a wheel file: that file;
- from a package index (no ``direct_url.json``) or another URL: no wheel; the requirement is
  ``foxhunt==<version>`` (or ``foxhunt @ <url>``), which that index rebuilds.

Why by hand: MLflow infers requirements from the modules a model imports, and pins a package
from an index; it has no notion of a project installed from a source folder
(``mlflow.models.add_libraries_to_model`` downloads every dependency as a wheel, several GB
with torch, and needs foxhunt on an index first).
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import Requirement

from foxhunt.ensemble.member_files import RegistryError

DIST = "foxhunt"
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE", "setup.py", "setup.cfg", "MANIFEST.in")
SOURCE_FOLDERS = ("src", "conf")
COPY_IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc", ".pytest_cache")
WHEEL_BUILD_TIMEOUT_S = 300


@dataclass(frozen=True)
class ModelEnvironment:
    """What a version's environment is made of: the wheel file to log with the model (None when
    foxhunt comes from an index) and the pip requirements, the wheel's first."""

    wheel: Path | None
    requirements: list[str]


def model_environment(workdir: Path, artifacts_dir: str) -> ModelEnvironment:
    """foxhunt's wheel (built or copied into ``workdir``) and the pinned requirements (module doc)."""
    dist = importlib.metadata.distribution(DIST)
    wheel, own = _foxhunt_itself(dist, workdir)
    declared = _wheel_requires(wheel) if wheel is not None else list(dist.requires or [])
    pins = [pin for pin in (_pin(requirement) for requirement in declared) if pin]
    first = f"{artifacts_dir}/{wheel.name}" if wheel is not None else own
    return ModelEnvironment(wheel, [first, *pins])


def _foxhunt_itself(dist, workdir: Path) -> tuple[Path | None, str]:
    """(wheel file or None, the requirement line when there is no wheel)."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None, f"{DIST}=={dist.version}"
    origin = json.loads(text)
    url = str(origin.get("url", ""))
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None, f"{DIST} @ {url}"
    path = Path(unquote(parsed.path))
    if "dir_info" in origin:
        return _build_wheel(path, workdir), ""
    if path.is_file() and path.suffix == ".whl":
        copied = workdir / path.name
        shutil.copyfile(path, copied)
        return copied, ""
    raise RegistryError(
        f"{DIST} was installed from {url}, which is gone: reinstall foxhunt (pip install -e <checkout>) to register"
    )


def _build_wheel(source: Path, workdir: Path) -> Path:
    if not (source / "pyproject.toml").is_file():
        raise RegistryError(
            f"{DIST} was installed from {source}, which holds no pyproject.toml any more: reinstall foxhunt to register"
        )
    with tempfile.TemporaryDirectory(prefix="foxhunt-wheel-") as scratch:
        tree = Path(scratch) / "src-tree"
        tree.mkdir()
        for name in SOURCE_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, tree / name)
        for name in SOURCE_FOLDERS:
            if (source / name).is_dir():
                shutil.copytree(source / name, tree / name, symlinks=True, ignore=COPY_IGNORED)
        out = workdir / "wheel"
        command = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(tree),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=WHEEL_BUILD_TIMEOUT_S, check=False)
    wheels = sorted(out.glob(f"{DIST}-*.whl")) if out.is_dir() else []
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise RegistryError(f"cannot build the {DIST} wheel a registered model carries, from {source}: {last[:200]}")
    return wheels[0]


def _wheel_requires(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` of a wheel: what the code it holds declares (an editable install's
    own metadata is as old as its last ``pip install -e``)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(archive.read(name).decode())
    return list(metadata.get_all("Requires-Dist") or [])


def _pin(line: str) -> str | None:
    """``name==installed`` for one of foxhunt's requirements (None: an extra's, or a marker that
    does not hold here)."""
    requirement = Requirement(line)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        return None
    try:
        installed = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return str(requirement)  # declared but not installed here: keep the declared range
    return f"{requirement.name}=={installed.split('+', 1)[0]}"
