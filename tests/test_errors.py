"""One line per error: Hydra's multi-line messages folded, option lists joined, causes kept; an input
error is its kind and message, exit status 2 without a traceback; a bug keeps its type and traceback."""

from __future__ import annotations

import pytest
from hydra.errors import MissingConfigException, OverrideParseException

from foxhunt.errors import (
    DEBUG_ENV,
    ConfigError,
    FolderError,
    UserError,
    debug_requested,
    error_line,
    is_user_error,
    one_line,
    one_line_error,
    reported,
    strip_debug_flag,
)

HYDRA = (
    "In 'train': Could not find 'asset/xx'\n\nAvailable options in 'asset':\n\t6e\n\tes\n\tnq\n\tzn\n"
    "Config search path:\n\tprovider=hydra, path=pkg://hydra.conf\n"
)


def test_hydras_message_becomes_one_line_with_its_options():
    error = ValueError(HYDRA)
    assert one_line_error(error, with_type=False) == (
        "In 'train': Could not find 'asset/xx' Available options in 'asset': 6e, es, nq, zn"
    )
    assert one_line_error(error, first_line=True) == "ValueError: In 'train': Could not find 'asset/xx'"


def test_the_cause_is_kept_and_the_length_bounded():
    try:
        try:
            raise OSError("disk full")
        except OSError as cause:
            raise RuntimeError("cannot write\nthe cache") from cause
    except RuntimeError as error:
        assert one_line_error(error) == "RuntimeError: cannot write the cache (disk full)"
        assert one_line_error(error, limit=12) == "RuntimeEr..."
    assert one_line_error(KeyboardInterrupt()) == "KeyboardInterrupt"


def test_a_logs_last_lines_keep_their_end():
    text = "epoch 1\n\n  step   9\nTraceback\nValueError: NaN"
    assert one_line(text, separator=" | ") == "epoch 1 | step 9 | Traceback | ValueError: NaN"
    assert one_line(text, 18, separator=" | ", keep_end=True) == "...ValueError: NaN"


def test_a_control_character_read_from_a_store_is_shown_escaped_in_an_error_line(capsys):
    """A run name from the store (register's refusals name it) carried an escape that retitled the
    terminal, a bell and a carriage return that forged a line (found by a helper probing stored files)."""
    name = "dqn\x1b]0;PWNED\x07\x1b[2J\rforged line"
    assert one_line(name) == "dqn\\x1b]0;PWNED\\x07\\x1b[2J forged line"
    with pytest.raises(SystemExit), reported("foxhunt ensemble"):
        raise UserError(f"run abc ({name}): no checkpoints")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and err.count("\n") == 1 and "\\x1b]0;PWNED" in err


def test_an_input_error_is_its_kind_and_message_and_a_bug_keeps_its_type():
    class DataError(UserError):
        kind = "data"

    assert error_line(ConfigError("model.lr=0: must be > 0")) == "config error: model.lr=0: must be > 0"
    assert error_line(DataError("bars.csv: row 3\nout of order")) == "data error: bars.csv: row 3 out of order"
    assert error_line(KeyError("x")) == "KeyError: 'x'" and not is_user_error(KeyError("x"))
    assert error_line(ConfigError("y" * 100), limit=20) == "config error: yyy..."


def test_hydras_input_errors_are_config_errors_naming_the_override():
    parse = OverrideParseException("model.lr=[1,", "no viable alternative at input '[1,'")
    assert is_user_error(parse)
    assert error_line(parse) == "config error: override 'model.lr=[1,': no viable alternative at input '[1,'"
    assert error_line(MissingConfigException(HYDRA)).startswith("config error: In 'train': Could not find 'asset/xx'")


def test_reported_exits_2_with_one_line_and_lets_a_bug_through(capsys):
    with pytest.raises(SystemExit) as done:
        with reported("foxhunt-train"):
            raise ConfigError("model.window.horizon=60: must be < model.window.seq_len (50)")
    assert done.value.code == 2 and done.value.__cause__ is None
    assert (
        capsys.readouterr().err == "foxhunt-train: config error: model.window.horizon=60: must be < model.window.seq_len (50)\n"
    )
    with pytest.raises(ZeroDivisionError):
        with reported("foxhunt-train"):
            _ = 1 / 0
    with pytest.raises(ConfigError):  # --debug: the input error keeps its traceback
        with reported("foxhunt-train", debug=True):
            raise ConfigError("x")
    assert capsys.readouterr().err == ""


def test_the_debug_switches(monkeypatch):
    for name in (DEBUG_ENV, "HYDRA_FULL_ERROR"):
        monkeypatch.delenv(name, raising=False)
    assert not debug_requested(["model=dqn"]) and debug_requested(["--debug"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    assert debug_requested([])
    assert strip_debug_flag(["a", "--debug", "b"]) == (["a", "b"], True) and strip_debug_flag(["a"]) == (["a"], False)
    denied = FolderError.of(PermissionError(13, "Permission denied", "/ro/outputs"), "paths.output_dir")
    assert (
        str(denied)
        == "cannot make the folder /ro/outputs: Permission denied (set paths.output_dir to a folder that can be written)"
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["runs", "top", "--limit", "-1"], "foxhunt runs top: usage error: Invalid value for '--limit'"),
        (["train", "list", "--page", "0"], "foxhunt train list: usage error: Invalid value for '--page'"),
        (["train", "list", "--limit", "0"], "foxhunt train list: usage error: Invalid value for '--limit'"),
        (["train", "watch", "j", "--interval", "0"], "foxhunt train watch: usage error: Invalid value for '--interval'"),
        (["train", "stop", "j", "--timeout", "-1"], "foxhunt train stop: usage error: Invalid value for '--timeout'"),
        (["memory", "compare", "--steps", "0"], "foxhunt memory compare: usage error: Invalid value for '--steps'"),
        (["data", "show", "--min-gap", "0"], "foxhunt data show: usage error: Invalid value for '--min-gap'"),
        (["train", "list", "--page", "two"], "foxhunt train list: usage error: Invalid value for '--page'"),
        (["train", "list", "--nope"], "foxhunt train list: usage error: No such option: --nope"),
        (["train", "watch"], "foxhunt train watch: usage error: Missing argument 'job'"),
        (["trian"], "foxhunt: usage error: No such command 'trian'"),
    ],
)
def test_every_commands_usage_error_is_one_line_exit_2(args, line):
    """Click's (and typer's) usage errors, options out of range among them, are one line on
    stderr and exit 2, for every foxhunt command (cli.py's group): no usage lines, no box."""
    from typer.testing import CliRunner

    from foxhunt.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(line), result.stderr


def test_help_and_no_arguments_still_show_the_help():
    from typer.testing import CliRunner

    from foxhunt.cli import app

    assert CliRunner().invoke(app, ["train", "list", "--help"]).exit_code == 0
    shown = CliRunner().invoke(app, ["train"])
    assert shown.exit_code == 2 and "Commands" in shown.output and "list" in shown.output
