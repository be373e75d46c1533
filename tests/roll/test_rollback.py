"""The alias records a roll, a rollback and a register commit (foxhunt.ensemble.registry): read
back from a store anyone may edit, checked by content; aliases MLflow reserves refused by the config."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from foxhunt.ensemble.member_files import RegistryError
from foxhunt.ensemble.registry import PROMOTION_TAG, pending_moves


def _store(record: str):
    run = SimpleNamespace(run_id="r1", start_ms=1, tags={PROMOTION_TAG: record})
    return SimpleNamespace(experiment_id=lambda name: "1", search=lambda journal, tags: [run])


@pytest.mark.parametrize(
    "record",
    [
        "[" * 5000 + "]" * 5000,  # a RecursionError traceback in every command before
        json.dumps([{"name": "foxhunt-dqn-es", "alias": "champion", "version": "99999999999999999999999"}]),  # an overflow
        json.dumps([{"name": "foxhunt-dqn-es", "alias": "champion", "version": "abc"}]),
        json.dumps([{"name": "foxhunt-dqn-es", "alias": "champion", "version": "-1"}]),
        json.dumps([{"name": "foxhunt-dqn-es", "alias": "champion", "version": "2", "was": "0"}]),
        json.dumps([{"name": 5, "alias": "champion", "version": "2"}]),
        json.dumps(["x"]), json.dumps({"name": "x"}), "not json",
        json.dumps({}), json.dumps([]),  # no moves: taken as an empty record and marked applied (found by a helper)
    ],
)  # fmt: skip
def test_an_edited_promotion_record_is_one_line(record):
    """Found by a helper probing the roll: a record nested 5,000 deep or naming a 23-digit version
    crashed roll, rollback, register, replay, serve and paper with a traceback."""
    with pytest.raises(RegistryError, match=r"^run r1 of experiment 'roll': its tag foxhunt.promotion is not a promotion record"):
        pending_moves(_store(record), "roll")


def test_an_honest_record_is_read():
    record = json.dumps([{"name": "foxhunt-dqn-es", "alias": "previous", "version": "1", "was": None},
                         {"name": "foxhunt-dqn-es", "alias": "champion", "version": 2, "was": "1"}])  # fmt: skip
    ((run_id, moves),) = pending_moves(_store(record), "roll")
    assert run_id == "r1" and [(m.alias, m.version, m.was) for m in moves] == [("previous", "1", None), ("champion", "2", "1")]


@pytest.mark.parametrize("alias", ["LATEST", "v7", "a b"])
@pytest.mark.parametrize("key", ["roll.previous_alias", "ensemble.alias"])
def test_an_alias_mlflow_reserves_is_refused_before_anything_trains(key, alias, tmp_path):
    """roll.previous_alias=latest trained, then committed a promotion MLflow refused to apply:
    every later roll, rollback and register failed on it (found by a helper probing the roll)."""
    from typer.testing import CliRunner

    from foxhunt.cli import app

    result = CliRunner().invoke(app, ["ensemble", "rollback", "asset=es", f"{key}={alias}"], env={"FOXHUNT_ROOT": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert f"config error: {key}=" in result.output and "must be a registry alias" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_committed_promotion_naming_a_deleted_version_is_abandoned_not_refused_forever():
    """A roll killed after its commit, then its new version deleted: every roll, rollback and
    register refused on the record, and nothing cleared it (found by a helper probing the roll).
    The record is abandoned (the aliases stay as they were), said in one line, and read no more."""
    from foxhunt.ensemble.registry import ABANDONED, PROMOTION_STATE_TAG, complete_pending

    record = json.dumps([{"name": "foxhunt-dqn-es", "alias": "previous", "version": "1", "was": None},
                         {"name": "foxhunt-dqn-es", "alias": "champion", "version": "2", "was": "1"}])  # fmt: skip
    store = _store(record)
    tagged: dict = {}
    store.get_version = lambda name, version: None if version == "2" else SimpleNamespace(version=version)
    store.tag = lambda run_id, tags: tagged.update(tags)
    store.set_alias = lambda *args: pytest.fail("an alias moved")
    (line,) = complete_pending(store, "roll")
    assert line.startswith("abandoned the promotion of run r1: it names foxhunt-dqn-es v2, which is not in the registry")
    assert tagged == {PROMOTION_STATE_TAG: ABANDONED}


def test_a_dry_run_applies_no_pending_promotion():
    """rollback --dry-run applied a committed-but-unapplied promotion (a forged record moved
    @champion during a dry run: found by a helper probing the roll). It says what it would do."""
    from foxhunt.ensemble.registry import complete_pending

    record = json.dumps([{"name": "foxhunt-dqn-es", "alias": "champion", "version": "2", "was": "1"}])
    store = _store(record)
    store.get_version = lambda name, version: SimpleNamespace(version=version)
    store.tag = lambda run_id, tags: pytest.fail("a record was tagged")
    store.set_alias = lambda *args: pytest.fail("an alias moved")
    (line,) = complete_pending(store, "roll", dry_run=True)
    assert line.startswith("would complete the promotion of run r1, interrupted after its commit: ")


def test_a_dry_runs_moves_are_those_after_the_pending_promotion():
    """A roll killed after its commit (@champion v1 -> v2, @previous -> v1 recorded, not applied):
    ``rollback --dry-run`` read the raw aliases and said "no previous version", exit 2, while
    every ensemble loaded v2 and the real rollback moved @champion v2 -> v1 (found by a helper
    probing the roll). The dry run's moves are the rollback's."""
    from foxhunt.ensemble.registry import rollback_moves

    record = json.dumps([{"name": "foxhunt-dqn-es", "alias": "previous", "version": "1", "was": None},
                         {"name": "foxhunt-dqn-es", "alias": "champion", "version": "2", "was": "1"}])  # fmt: skip
    store = _store(record)
    raw = {"champion": SimpleNamespace(version="1"), "previous": None}  # the aliases as the killed roll left them
    store.get_version_by_alias = lambda name, alias: raw[alias]
    store.get_version = lambda name, version: SimpleNamespace(version=version)
    moves = rollback_moves(store, "foxhunt-dqn-es", "champion", "previous", "roll")
    assert [(m.alias, m.version, m.was) for m in moves] == [("champion", "1", "2"), ("previous", "2", "1")]
