"""The consoles every command prints to, and the one way a command fails on bad input."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def fail(exc: Exception | str) -> None:
    """Print `error: ...` on stderr and exit 1. The message is escaped: a URL or a list in brackets
    (`[s3]`, `[0, 1]`) must not be eaten as rich markup."""
    err.print(f"[red]error:[/red] {escape(str(exc))}")
    raise typer.Exit(1)
