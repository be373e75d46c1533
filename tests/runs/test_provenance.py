"""What a run says it came from: the commit, read from ``.git`` without running git (a branch
ref, a packed ref, a detached HEAD, a worktree's ``.git`` file), nothing outside a checkout or
inside an installed package; and what a reproduction compares: the package's files and its
uncommitted diff, the installed packages, the device, the digests of files and bars."""

from __future__ import annotations

import importlib.metadata
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from foxhunt.runs.provenance import (
    code_provenance,
    device_provenance,
    environment_provenance,
    file_sha256,
    git_commit,
    split_sha256,
    work_tree,
)

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def test_a_branch_ref_a_packed_ref_and_a_detached_head(tmp_path):
    git = tmp_path / "repo" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text(SHA + "\n")
    source = tmp_path / "repo" / "src" / "pkg" / "module.py"
    source.parent.mkdir(parents=True)
    assert git_commit(source) == SHA
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{OTHER} refs/heads/main\n")
    assert git_commit(source) == OTHER
    (git / "HEAD").write_text(SHA)
    assert git_commit(source) == SHA


def test_a_worktree_reads_its_own_head_and_the_common_refs(tmp_path):
    common = tmp_path / "main" / ".git"
    own = common / "worktrees" / "wt"
    (common / "refs" / "heads").mkdir(parents=True)
    own.mkdir(parents=True)
    (common / "refs" / "heads" / "feature").write_text(OTHER)
    (own / "HEAD").write_text("ref: refs/heads/feature\n")
    (own / "commondir").write_text("../..\n")
    checkout = tmp_path / "wt"
    checkout.mkdir()
    (checkout / ".git").write_text(f"gitdir: {own}\n")
    assert git_commit(checkout / "file.py") == OTHER


def test_no_checkout_no_commit(tmp_path):
    assert git_commit(tmp_path / "file.py") is None


# -- what a reproduction compares (foxhunt.runs.provenance: the provenance files) -------------
def test_an_installed_package_inside_a_checkout_names_no_commit(tmp_path):
    """A virtual environment inside some checkout: foxhunt installed there is not that checkout's
    code (named the checkout's commit before)."""
    git = tmp_path / "repo" / ".git"
    git.mkdir(parents=True)
    (git / "HEAD").write_text(SHA)
    installed = tmp_path / "repo" / ".venv" / "lib" / "python3.11" / "site-packages" / "foxhunt" / "runs" / "provenance.py"
    installed.parent.mkdir(parents=True)
    assert git_commit(tmp_path / "repo" / "src" / "foxhunt" / "x.py") == SHA
    assert git_commit(installed) is None and work_tree(installed) is None


def _git(tree, *args):
    done = subprocess.run(
        ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _package(tree):
    package = tree / "src" / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "model.py").write_text("WIDTH = 32\n")
    (package / "sub" / "__pycache__").mkdir()
    (package / "sub" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0compiled")
    return package


def test_code_provenance_of_a_checkout_clean_edited_and_with_a_new_file(tmp_path):
    package = _package(tmp_path)
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "notes.txt").write_text("outside the package: not its code\n")

    clean, diff = code_provenance(package)
    assert (clean["source"], clean["commit"], clean["dirty"], clean["diff_sha256"], diff) == ("git", head, False, None, None)
    assert sorted(clean["files"]) == ["pkg/__init__.py", "pkg/sub/model.py"]  # compiled caches left out
    assert clean["files"]["pkg/sub/model.py"] == file_sha256(package / "sub" / "model.py")

    (package / "sub" / "model.py").write_text("WIDTH = 64\n")
    (package / "sub" / "extra.py").write_text("NEW = 1\n")
    edited, diff = code_provenance(package)
    assert edited["dirty"] is True and edited["commit"] == head and edited["digest"] != clean["digest"]
    assert "-WIDTH = 32" in diff and "+WIDTH = 64" in diff and "+NEW = 1" in diff and "b/src/pkg/sub/extra.py" in diff
    assert edited["diff_sha256"] and not (tmp_path / ".git" / "index.lock").exists()


def test_code_provenance_of_an_installed_copy_has_its_version_and_files_only(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text(SHA)
    package = _package(tmp_path / "venv" / "lib" / "site-packages")
    code, diff = code_provenance(package)
    assert (code["source"], code["commit"], code["dirty"], diff) == ("installed", None, None, None)
    assert code["package_version"] == importlib.metadata.version("foxhunt") and "pkg/sub/model.py" in code["files"]


def test_environment_provenance_names_python_and_every_installed_package():
    import platform

    environment = environment_provenance()
    assert environment["python"]["version"] == platform.python_version()
    for name in ("torch", "lightning", "numpy", "mlflow", "pandas", "foxhunt"):
        assert environment["packages"][name] == importlib.metadata.version(name)
    names = {d.metadata["Name"].lower().replace("_", "-").replace(".", "-") for d in importlib.metadata.distributions()}
    assert len(environment["packages"]) == len(names)


def test_device_provenance_says_the_device_and_the_deterministic_settings():
    import torch

    device = device_provenance("cpu", True)
    assert device["device"] == "cpu" and device["name"] == device["cpu"] and device["torch_threads"] == torch.get_num_threads()
    assert device["trainer_deterministic"] is True
    assert device["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 50), elements=st.floats(-1e6, 1e6, width=32)), st.data())
def test_a_splits_digest_is_its_bars_one_value_changes_it(values, data):
    stamps = np.arange(len(values), dtype=np.int64)
    digest = split_sha256({"features": values, "timestamps": stamps, "roll_price": None})
    assert split_sha256({"roll_price": None, "timestamps": stamps.copy(), "features": values.copy()}) == digest
    moved = values.copy()
    i = data.draw(st.integers(0, len(values) - 1))
    moved[i] = np.float32(moved[i] + 1.0) if moved[i] + 1.0 != moved[i] else np.float32(0.5)
    if moved[i] != values[i]:
        assert split_sha256({"features": moved, "timestamps": stamps, "roll_price": None}) != digest
    assert split_sha256({"features": values, "timestamps": stamps, "roll_price": values.astype(np.float64)}) != digest


@pytest.mark.parametrize("edit", ["contents", "size"])
def test_a_files_digest_is_its_bytes(tmp_path, edit):
    path = tmp_path / "bars.csv"
    path.write_text("a,b\n1,2\n")
    before = file_sha256(path)
    path.write_text("a,b\n1,3\n" if edit == "contents" else "a,b\n1,2\n3,4\n")
    assert file_sha256(path) != before and file_sha256(path) == file_sha256(path)
