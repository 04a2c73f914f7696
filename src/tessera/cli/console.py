"""The consoles every command prints to, and the one way a command fails on bad input."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from tessera.storage.url import MalformedURL

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
# Set by `tessera --debug ...` (the root option), so every sub-command's failure shows its traceback.
debug_all = False


def fail(exc: Exception | str, *, code: int = 1, debug: bool = False) -> None:
    """Print `error: ...` on stderr and exit `code` (2: the input is wrong, 1: it failed at run time).
    The message is escaped: a URL or a list in brackets (`[s3]`, `[0, 1]`) must not be eaten as rich
    markup. With `debug` the exception is raised again, so its traceback shows where it came from."""
    if (debug or debug_all) and isinstance(exc, Exception):
        raise exc
    if isinstance(exc, MalformedURL):  # a typo in a URL the user gave is a usage error, wherever it is caught
        code = 2
    err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)  # one line, however long
    if getattr(exc, "excerpt", None):  # the line a syntax error is on, with a caret (syntax_errors.py)
        err.print(exc.excerpt.strip("\n"), soft_wrap=True, markup=False, highlight=False)  # type: ignore[union-attr]
    raise typer.Exit(code)
