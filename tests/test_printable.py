"""Text from a store reaches the terminal with its control characters visible and no markup
(foxhunt.printable)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from foxhunt.printable import shown, visible


def test_escapes_and_markup_are_shown_not_acted_on():
    planted = "\x1b]0;OWNED\x07\x1b[2J[red]RED[/red]\nfake line\t\x9b"
    assert visible(planted) == "\\x1b]0;OWNED\\x07\\x1b[2J[red]RED[/red]\\nfake line\\t\\x9b"
    text = shown(planted, style="dim")
    assert text.plain == visible(planted) and not text.spans and text.style == "dim"  # [red] stays text


@given(st.text())
def test_nothing_a_terminal_acts_on_is_left_and_printable_text_is_kept(value):
    out = visible(value)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
    if not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        assert out == value
