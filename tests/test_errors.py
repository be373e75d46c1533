"""One line per error: Hydra's multi-line messages folded, option lists joined, causes kept."""

from __future__ import annotations

from foxhunt.errors import one_line, one_line_error

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
