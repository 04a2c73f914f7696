"""The `tessera` command. Each layer adds its sub-command group here.

Sub-commands are imported when they are asked for: `tessera run list` or `tessera server start` must not
pay for torch and transformers (two seconds per call), which only `train`, `llm` and `data` need.
"""

from __future__ import annotations

import importlib

import click
import typer
from typer.core import TyperGroup

from tessera import __version__
from tessera.cli import console
from tessera.cli.examples import add_examples, epilog

# name -> (module, attribute, is a group of sub-commands, the module's attribute holding the command's click
# context settings or None); in `--help` order.
_COMMANDS: dict[str, tuple[str, str, bool, str | None]] = {
    "storage": ("tessera.cli.storage", "app", True, None),
    "data": ("tessera.cli.data", "app", True, None),
    "run": ("tessera.cli.run", "app", True, None),
    "cluster": ("tessera.cli.cluster", "app", True, None),
    "secret": ("tessera.cli.secret", "app", True, None),
    "server": ("tessera.cli.server", "app", True, None),
    "launch": ("tessera.cli.distributed_launch", "launch", False, "CONTEXT"),
    "llm": ("tessera.cli.llm", "app", True, None),
    "train": ("tessera.cli.train", "train", False, None),
    "recipe": ("tessera.cli.recipe", "app", True, None),
    "login": ("tessera.cli.login", "login", False, None),
    "logout": ("tessera.cli.login", "logout", False, None),
}


def _load(name: str) -> click.Command:
    """Import one sub-command and turn it into the click command typer would have made at start-up."""
    module_name, attr, is_group, context_attr = _COMMANDS[name]
    module = importlib.import_module(module_name)
    target = getattr(module, attr)
    if is_group:
        command = typer.main.get_command(target)
    else:
        context = getattr(module, context_attr) if context_attr else None
        single = typer.Typer(add_completion=False)  # the completion options belong to `tessera` itself
        single.command(name, context_settings=context)(target)
        command = typer.main.get_command(single)
    command.name = name
    add_examples(command, name)
    return command


class LazyGroup(TyperGroup):
    """A typer group whose sub-commands are imported on first use (module docstring)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*_COMMANDS, *(n for n in self.commands if n not in _COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _COMMANDS:
            self.commands[cmd_name] = _load(cmd_name)
        return self.commands.get(cmd_name)


app = typer.Typer(help="Tessera: train models on any compute, with data and checkpoints in object storage.",
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=LazyGroup, epilog=epilog(""))


@app.callback(invoke_without_command=True)
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help="On an error, show the Python traceback "
                                                             "(any sub-command).")) -> None:
    console.debug_all = debug
    if version:
        typer.echo(__version__)
        raise typer.Exit()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
