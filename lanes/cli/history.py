"""``lanes history add``: chat history for the memory runs."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from lanes.cli.common import emit_json, pass_settings
from lanes.errors import InvalidInput
from lanes.memory import check_message, parse_json_lines
from lanes.ops.history import add_history


@click.group(name="history")
def command() -> None:
    """Chat history: messages (chat id, UTC time, role, text) the memory runs read."""


@command.command(name="add")
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path),
              help="A JSON Lines file ('-' for stdin): one {chat_id, at, role, text} object per line.")
@click.option("--chat", "chat_id", help="Chat id of one message.")
@click.option("--at", help="Its time, ISO 8601 with a zone (e.g. 2026-03-01T10:15:00Z).")
@click.option("--role", type=click.Choice(["user", "assistant", "system", "tool"]), default="user", show_default=True)
@click.option("--text", help="Its text.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_settings
def add(settings, path, chat_id, at, role, text, as_json) -> None:
    """Add one message, or every message of a JSON Lines file.

    A file is checked whole first: any bad line is refused with its line
    number and nothing of the file is written.
    """
    if path is not None and any(v is not None for v in (chat_id, at, text)):
        raise InvalidInput("give either --file or --chat/--at/--text, not both")
    if path is not None:
        messages = _read_file(path)
    elif chat_id is None or at is None or text is None:
        raise InvalidInput("give --chat, --at and --text for one message, or --file FILE.jsonl")
    else:
        messages = [check_message({"chat_id": chat_id, "at": at, "role": role, "text": text})]
    added = add_history(settings, messages)
    count, chats, already = added["added"], added["chats"], added["already"]
    if as_json:
        emit_json(added)
    else:
        click.echo(f"added {count} message{'s' if count != 1 else ''} in {chats} chat{'s' if chats != 1 else ''}"
                   + (f"; {already} already stored, skipped" if already else ""))


def _read_file(path: Path):
    if str(path) == "-":
        return parse_json_lines(sys.stdin, source="stdin")
    try:
        with path.open(encoding="utf-8") as handle:
            return parse_json_lines(handle, source=str(path))
    except FileNotFoundError:
        raise InvalidInput(f"history file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"history file {str(path)!r} is not UTF-8 text ({exc.reason}); nothing was written") from None
    except OSError as exc:
        raise InvalidInput(f"history file {str(path)!r} cannot be read: {exc.strerror}") from None
