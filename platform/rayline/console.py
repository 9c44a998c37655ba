"""The terminal consoles the CLI prints through: text is printed as written, never as markup.

rich interprets `[...]` in a string as markup by default, so a spec named "[/x]", a column
named "[bold]" or an output path "[/]" either crashed the CLI with MarkupError or lost text.
Markup, emoji codes (":smile:") and highlighting are off on both consoles; colour comes only
from explicit styles (`styled`), so no user-supplied text is ever parsed.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

__all__ = ["console", "err_console", "styled", "plain_console"]


def plain_console(*, stderr: bool = False) -> Console:
    """A console that prints strings verbatim: no markup, no emoji codes, no highlighting.

    soft_wrap: a message is never cut into lines at the terminal width (80 columns when
    output is not a terminal, as in CI logs), so a one-line error stays one line. Tables
    still lay out to the width.
    """
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False, soft_wrap=True)


console = plain_console()
err_console = plain_console(stderr=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain strings and (text, style) pairs; the text is never parsed as markup.

    >>> styled(("error:", "red"), " ", "[/x] is not a name")
    """
    return Text.assemble(*parts)
