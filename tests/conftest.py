"""Shared pytest fixtures, and the suite's hooks: a pytest-xdist worker's torch threads, the order of the files."""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

import pytest

from configs import compose_train_config  # tests/ is on sys.path: a helper module
from jobs_store import Store, build_store

# Tables (rich) are as wide as COLUMNS says when the output is not a terminal: one width for every
# test, whatever the runner (a pytest-xdist worker inherits no terminal and would cut ids at 80).
os.environ["COLUMNS"] = "200"

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "real"


# The longest test files, longest first, by the seconds of their tests in the suite (pytest
# --durations, two workers), measured 2026-12-05 03:10-03:43 UTC beside two probing helpers (load
# 5-7, so about three times the quiet figures): 296, 223, 221, 180, 120, 114, 102, 99, 94, 88, 83, 79,
# 75, 73, 60, 59, 54, 48, then the rest under 45 (issue 39 listed the first order; the memory
# prediction, export, registry and serve files had grown past it and ran last). pytest-xdist's
# --dist loadfile runs a file whole on one worker and hands out the files with the most tests
# first, so files of one or two minute-long tests came last, and the suite's last minutes ran on
# one worker while the other idled. Started first, the two workers share them and the short files
# fill in after. Files not named keep xdist's order, the most tests first.
LONGEST_FIRST = (
    "tests/memory/test_predict.py",
    "tests/roll/test_roll_crash.py",
    "tests/sweeps/test_multirun.py",
    "tests/ensemble/test_export.py",
    "tests/training/test_checkpoint_stamps.py",
    "tests/test_same_second_runs.py",
    "tests/ensemble/test_registry.py",
    "tests/roll/test_swap.py",
    "tests/ensemble/test_serve.py",
    "tests/jobs/test_jobs_e2e.py",
    "tests/sweeps/test_optuna_search.py",
    "tests/training/test_resume_point.py",
    "tests/memory/test_validate.py",
    "tests/test_run_records.py",
    "tests/models/test_tft.py",
    "tests/test_kill_resume.py",
    "tests/ensemble/test_swap_state.py",
    "tests/precision/test_bf16.py",
    "tests/test_style.py",
    "tests/test_bad_inputs.py",
    "tests/training/test_cell.py",
    "tests/test_killed_sweep.py",
    "tests/runs/test_server_lock.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """:data:`LONGEST_FIRST`, then the other files by their number of tests (each file's tests
    together, in their own order)."""
    rank = {REPO_ROOT / name: place for place, name in enumerate(LONGEST_FIRST)}
    tests_in = Counter(item.path for item in items)
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), -tests_in[item.path]))


def pytest_configure(config: pytest.Config) -> None:
    """The controller keeps :data:`LONGEST_FIRST`'s order (xdist's own puts files with the most
    tests first)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.fixture(scope="session", autouse=True)
def _a_workers_share_of_the_cores() -> None:
    """A pytest-xdist worker trains with its share of the cores, as a sweep's jobs do
    (foxhunt.sweeps.resources.threads_per_job): two workers of torch's default two threads each
    on two cores waited on each other's spinning threads: tests/training/test_cell.py's eight asset
    cells took 112-212 s beside a busy process, 37-64 s with one thread. Set as the first test starts, not
    in pytest_configure: an import there (torch's, foxhunt's) keeps its warning filters for the
    whole session, where pytest undoes those of the imports made while it collects."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        from foxhunt.sweeps.resources import threads_per_job

        torch.set_num_threads(threads_per_job(int(workers)))


@pytest.fixture(scope="session", autouse=True)
def _fresh_stores_from_a_template(tmp_path_factory):
    """Every empty SQLite MLflow store the tests' own process opens gets its tables from one store
    migrated once (tests/store_template.py): MLflow's alembic migrations cost about a second of CPU
    per new store, and most tests train into a store of their own. Imported as the first test
    starts (as the fixture above), not at collection."""
    import store_template

    with pytest.MonkeyPatch.context() as patch:
        store_template.install(patch, tmp_path_factory.mktemp("store_template"))
        yield


@pytest.fixture(autouse=True)
def _logging_as_found():
    """Each test ends with the root logger's handlers and level as it found them. A Hydra app run
    in-process (foxhunt-train's main, a sweep) configures logging: a handler on the stream that
    test captured, closed when it ends; a later command logging through it printed "--- Logging
    error ---" into that test's output (seen under pytest-xdist, whose workers run files in
    another order)."""
    root = logging.getLogger()

    def own() -> list[logging.Handler]:  # pytest's capture handlers come and go with each phase: not ours to touch
        return [h for h in root.handlers if not type(h).__module__.startswith("_pytest")]

    handlers, level = own(), root.level
    yield
    for handler in [h for h in own() if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    for handler in [h for h in handlers if h not in root.handlers]:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real CME test files (../shared/data/real); tests using it skip when it is absent."""
    if not REAL_DATA_DIR.is_dir():
        pytest.skip(f"real data folder {REAL_DATA_DIR} is absent")
    return REAL_DATA_DIR


@pytest.fixture
def compose_cfg(tmp_path: Path):
    """``compose_cfg(overrides)`` -> composed training config rooted in a fresh tmp folder."""

    def _compose(overrides: list[str] | None = None):
        return compose_train_config(list(overrides or []), tmp_path)

    return _compose


@pytest.fixture(scope="session")
def jobs_store(tmp_path_factory) -> Store:
    """A hand-populated MLflow store of jobs in every state (jobs_store.py), built once: read by
    the job views (tests/jobs) and by the store's readers (tests/runs)."""
    return build_store(tmp_path_factory.mktemp("jobs_store"))
