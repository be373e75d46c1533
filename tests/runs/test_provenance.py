"""The commit a run names: read from ``.git`` without running git (a branch ref, a packed ref,
a detached HEAD, a worktree's ``.git`` file), nothing outside a checkout."""

from __future__ import annotations

from foxhunt.runs.provenance import git_commit

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
