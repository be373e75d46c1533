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


BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def _acted_on(c: str) -> bool:
    return ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or ord(c) in BIDI


@given(st.text())
def test_nothing_a_terminal_acts_on_is_left_and_printable_text_is_kept(value):
    out = visible(value)
    assert not any(_acted_on(c) for c in out)
    if not any(_acted_on(c) for c in value):
        assert out == value


def test_bidirectional_controls_are_shown_not_acted_on():
    """An asset 'es' + U+202E + 'txt' printed raw reversed the rest of the line (found by a helper
    probing train list): a name could show as another."""
    assert visible("es\u202etxt\u2066x\u200f") == "es\\u202etxt\\u2066x\\u200f"
