"""The README and docs/ as a reader meets them.

Blocks run as written elsewhere: the README's tour (tests/cli/test_readme.py), the
API's curl block (tests/api/test_e2e.py), the simulator's blocks
(tests/sim/test_docs_examples.py). Here: the README keeps its two commands first and
fits on a screen or two, every relative link of the README and docs/ resolves (the
file, and the heading an anchor names), and every ``lanes`` command in their shell
blocks parses against the real CLI: its subcommand, options and arguments exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from lanes.cli import SUBCOMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEPARATORS = {"&", "&&", "|", "||", ";"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # NAME, ID, FILE: a value the reader fills in


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code taken out: links there are examples."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def test_the_readme_starts_with_its_two_commands_and_fits_on_a_screen_or_two():
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)\n```", text, re.S)
    assert first and text.index(first.group(0)) < text.index("\n## "), "the commands come before any section"
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["python3 dev.py demo", "python3 dev.py test"]
    lines = text.count("\n")
    assert lines <= 200, f"README.md has {lines} lines; its detail belongs in docs/ (README links each page)"


def test_the_readme_links_every_page_of_docs():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"]({page_id(page)})" in readme, f"README.md does not link {page_id(page)}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {page_id(linked)}")
    assert not broken, f"{page_id(page)}: " + "; ".join(broken)


def shell_lines(text: str) -> list[str]:
    """Every command line of the page's ```sh blocks, continuation lines joined."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)\n```", text, re.S):
        pending = ""
        for line in block.splitlines():
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            lines.append(pending + line)
            pending = ""
    return lines


def lanes_commands(line: str) -> list[list[str]]:
    """The arguments of each ``lanes`` command on a shell line (``$(lanes ...)``,
    ``... | lanes ...``, ``docker compose run lanes lanes ...`` included); ``[--x]``
    (an optional part) is given as ``--x``."""
    tokens = shlex.split(line, comments=True)
    found = []
    for at, token in enumerate(tokens):
        if token.split("$(")[-1] != "lanes" or at + 1 == len(tokens) or tokens[at + 1] not in SUBCOMMANDS:
            continue
        args = []
        for arg in tokens[at + 1:]:
            if arg in SEPARATORS:
                break
            closes = arg.endswith(")") and arg.count(")") > arg.count("(")
            arg = arg.rstrip(")") if closes else arg
            if arg.strip("[]"):
                args.append(arg.strip("[]"))
            if closes:
                break
        found.append(args)
    return found


def documented_commands() -> list[tuple[str, list[str]]]:
    return [(page_id(page), args) for page in PAGES for line in shell_lines(page.read_text())
            for args in lanes_commands(line)]


def unparsed(ctx: click.Context) -> list[str]:
    """What a group left for its subcommand: click keeps the subcommand's name apart
    (``_protected_args`` since click 8.2, ``protected_args`` before)."""
    protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
    return [*protected, *ctx.args]


def parse(args: list[str]) -> None:
    """Parse ``lanes ARGS`` as the CLI would, down to its last subcommand, invoking nothing.
    A placeholder (``--run ID``) stands for a value the reader gives: ``1`` here, which
    every option it fills in the docs takes (an id, a chat, a name)."""
    args = ["1" if PLACEHOLDER.match(arg) else arg for arg in args]
    ctx = main.make_context("lanes", args)
    command: click.Command = main
    while isinstance(command, click.Group) and unparsed(ctx):
        name, sub, rest = command.resolve_command(ctx, unparsed(ctx))
        if sub is None:
            raise click.UsageError(f"no such command {name!r} under {command.name!r}")
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub


def test_the_docs_shell_blocks_hold_lanes_commands():
    # The scan below finds them: a change to how blocks are written cannot empty it unseen.
    pages = {page for page, _ in documented_commands()}
    assert {"README.md", "docs/API.md", "docs/MEMORY_RUNS.md", "docs/SIMULATOR.md", "docs/OPERATING.md"} <= pages


@pytest.mark.parametrize(("page", "args"), documented_commands(),
                         ids=[f"{page}: lanes {' '.join(args)[:60]}" for page, args in documented_commands()])
def test_every_documented_lanes_command_parses(page, args):
    try:
        parse(args)
    except click.ClickException as exc:
        pytest.fail(f"{page}: `lanes {shlex.join(args)}` does not parse: {exc.format_message()}")


@pytest.mark.parametrize("args", [["pools", "set-wdith", "gpu", "3"], ["worker", "--flet", "gpu"],
                                  ["memory", "retry", "--run", "ID", "--chats", "c1"], ["nope"]])
def test_a_broken_command_does_not_parse(args):
    with pytest.raises(click.ClickException):
        parse(args)
