"""The hot swap's watcher (foxhunt.ensemble.loading.VersionWatcher) against a scripted registry:
what moved together is handed over together, and a rollback drops a load that waits."""

from __future__ import annotations

from types import SimpleNamespace

from omegaconf import OmegaConf

from foxhunt.ensemble import loading

CFG = OmegaConf.create({
    "logger": {"tracking_uri": "sqlite:///unused.db"}, "asset": {"key": "es"}, "roll": {"experiment": "roll", "swap": {"poll_s": 1.0}},
    "ensemble": {"models": ["dqn", "ppo"], "registry_prefix": "foxhunt", "alias": "champion", "versions": {}},
})  # fmt: skip


def _watcher(monkeypatch, reads: list[dict[str, str]]):
    """A watcher whose registry answers ``reads`` in turn, one whole dict per family read (the
    last one ever after); the current versions are v1."""
    answers = iter(reads)
    state = {"now": reads[0], "asked": set()}

    def resolved(store, name, alias, journal):
        if name in state["asked"]:  # a new read of every family begins
            state["asked"].clear()
        if not state["asked"]:
            state["now"] = next(answers, state["now"])
        state["asked"].add(name)
        return SimpleNamespace(version=state["now"][name])

    monkeypatch.setattr(loading, "resolved_version", resolved)
    monkeypatch.setattr(loading, "RunStore", lambda uri: None)
    monkeypatch.setattr(
        loading, "load_member", lambda cfg, name, version, weights, workdir: SimpleNamespace(name=name, version=str(version))
    )
    current = {"foxhunt-dqn-es": "1", "foxhunt-ppo-es": "1"}
    return loading.VersionWatcher(CFG, "/tmp/unused", current, say=lambda line: None)


def test_two_families_promoted_at_once_are_handed_over_together(monkeypatch):
    """A promotion committed between the reads of DQN and PPO: the swap handed over the new DQN
    alone, and bars were decided by the new DQN beside the old PPO (found by a helper probing the
    roll). Reads that disagree are read again at the next poll."""
    moved = {"foxhunt-dqn-es": "2", "foxhunt-ppo-es": "2"}
    watcher = _watcher(monkeypatch, [{"foxhunt-dqn-es": "2", "foxhunt-ppo-es": "1"}, moved, moved, moved])
    watcher.poll()
    first = watcher.take()
    watcher.poll()
    later = watcher.take()
    handed = [sorted((m.name, m.version) for m in batch) for batch in (first, later) if batch]
    assert handed == [[("foxhunt-dqn-es", "2"), ("foxhunt-ppo-es", "2")]]


def test_a_load_that_waits_is_dropped_when_the_alias_is_rolled_back(monkeypatch):
    """v2 loaded while the server was idle, then rolled back to v1: take() still handed v2 over
    and the rolled-back version decided (found by a helper probing the roll)."""
    promoted = {"foxhunt-dqn-es": "2", "foxhunt-ppo-es": "1"}
    back = {"foxhunt-dqn-es": "1", "foxhunt-ppo-es": "1"}
    watcher = _watcher(monkeypatch, [promoted, promoted, back, back])
    watcher.poll()
    watcher.poll()
    assert watcher.take() == []


def test_what_moved_with_a_refused_version_is_held_back_not_swapped_in_alone(monkeypatch):
    """A rollback of both families whose DQN version is refused (an edited member.json): the PPO
    version was swapped in alone, and /info named DQN v1 beside PPO v2, a set the registry never
    held (found by a helper probing the roll). The old set decides on, whole, and both are said."""
    from foxhunt.errors import UserError

    moved = {"foxhunt-dqn-es": "2", "foxhunt-ppo-es": "2"}
    watcher = _watcher(monkeypatch, [moved])
    said: list[str] = []
    watcher.say = said.append

    def load(cfg, name, version, weights, workdir):
        if name == "foxhunt-dqn-es":
            raise UserError("artifacts/member.json is not the file registered")
        return SimpleNamespace(name=name, version=str(version))

    monkeypatch.setattr(loading, "load_member", load)
    assert watcher.poll() == [] and watcher.take() == []
    assert said[0].startswith("foxhunt-dqn-es v2: refused, not swapped in (artifacts/member.json")
    assert said[1] == ("foxhunt-ppo-es v2: held back, not swapped in alone (foxhunt-dqn-es v2 of the registry's set is "
                       "refused); v1 keeps deciding")  # fmt: skip
    watcher.poll()
    assert watcher.take() == [] and len(said) == 2  # not tried again until an alias moves


def test_a_refused_version_is_tried_again_after_retry_s_and_said_once(monkeypatch):
    """A version refused because the store could not be read for a moment was never tried again:
    the old version served on while the registry named the new one, and /info did not say so
    (found by a helper probing the roll). It is listed in ``refusals``, looked at again
    ``roll.swap.retry_s`` later (a retry failing for the same reason says nothing), and loads."""
    from foxhunt.errors import UserError

    moved = {"foxhunt-dqn-es": "2", "foxhunt-ppo-es": "1"}
    watcher = _watcher(monkeypatch, [moved])
    watcher.retry_s = 60.0
    now = [0.0]
    watcher.clock = lambda: now[0]
    said: list[str] = []
    watcher.say = said.append
    readable, loads = [False], []

    def load(cfg, name, version, weights, workdir):
        loads.append(now[0])
        if not readable[0]:
            raise UserError("artifacts/weights.pt cannot be read from the artifact store")
        return SimpleNamespace(name=name, version=str(version))

    monkeypatch.setattr(loading, "load_member", load)
    watcher.poll()
    assert watcher.refusals == {"foxhunt-dqn-es": {"version": "2", "reason": said[0].split(": ", 1)[1].rsplit("; v1", 1)[0]}}
    now[0] = 30.0
    watcher.poll()  # before retry_s: not looked at
    now[0] = 61.0
    watcher.poll()  # looked at again, refused for the same reason: nothing said
    assert len(said) == 1 and loads == [0.0, 61.0]
    readable[0], now[0] = True, 122.0
    watcher.poll()
    assert [(m.name, m.version) for m in watcher.take()] == [("foxhunt-dqn-es", "2")] and watcher.refusals == {}


def test_a_family_held_back_goes_in_with_the_refused_ones_fix(monkeypatch):
    """DQN v2 refused, PPO v2 held back; then DQN v3 (fixed) promoted: DQN v3 was handed over
    alone beside PPO v1, PPO v2 left out for good; and with retries, DQN v2's retry came before
    PPO's and went in alone (found reviewing the change). The held-back member goes in with it."""
    from foxhunt.errors import UserError

    both = {"foxhunt-dqn-es": "2", "foxhunt-ppo-es": "2"}
    fixed = {"foxhunt-dqn-es": "3", "foxhunt-ppo-es": "2"}
    watcher = _watcher(monkeypatch, [both, both, fixed, fixed])
    watcher.say = lambda line: None
    loads: list[tuple[str, int]] = []

    def load(cfg, name, version, weights, workdir):
        loads.append((name, version))
        if (name, version) == ("foxhunt-dqn-es", 2):
            raise UserError("artifacts/member.json is not the file registered")
        return SimpleNamespace(name=name, version=str(version))

    monkeypatch.setattr(loading, "load_member", load)
    watcher.poll()
    assert watcher.take() == [] and set(watcher.refusals) == {"foxhunt-dqn-es", "foxhunt-ppo-es"}
    watcher.poll()
    assert sorted((m.name, m.version) for m in watcher.take()) == [("foxhunt-dqn-es", "3"), ("foxhunt-ppo-es", "2")]
    assert loads.count(("foxhunt-ppo-es", 2)) == 1 and watcher.refusals == {}  # loaded once, held, then handed over
