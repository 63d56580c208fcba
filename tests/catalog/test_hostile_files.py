"""Hostile catalog files end in one bounded line, the same on both databases.

Repeated keys in flow style, whitespace and control characters in URLs and
names, huge keys, deep nesting, self-containing aliases, files far over the
size cap and device files.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import tracemalloc

import pytest
from click.testing import CliRunner

from lanes.catalog import apply_document, catalog_version
from lanes.catalog import files
from lanes.catalog.files import parse, read_document
from lanes.catalog.yaml_strict import MAX_DOCUMENT_BYTES
from lanes.cli import main
from lanes.errors import CatalogInvalid, InvalidInput
from tests.catalog.conftest import EXAMPLE, snapshot


def example() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


@pytest.mark.parametrize("text", [
    "pools: [{name: a, width: 2, width: 20}]\n",
    "{pools: [], pools: [{name: a, width: 1}]}\n",
    "pools:\n  - {name: a, width: 2}\nmodels: [{name: m, base_url: 'http://h/v1', base_url: 'http://i/v1'}]\n",
])
def test_a_key_repeated_on_one_line_is_refused(text):
    with pytest.raises(InvalidInput, match=r"fleet.yaml: not valid YAML \(line \d+, column \d+\): duplicate key"):
        parse(text, "yaml", source="fleet.yaml")


BAD_CHARACTERS = ["\x00", "\n", " ", "\t", "\x7f", "\u200b", "\u2028", "\x1b"]


PLACES = ["base_url", "metrics_url", "pool name", "model name", "workflow name", "previous name", "api_key_env"]


def with_character(char: str, where: str) -> dict:
    document = example()
    if where == "base_url":
        document["models"][0]["base_url"] = f"http://127.0.0.1:8700/v{char}1"
    elif where == "metrics_url":
        document["pools"][0]["metrics_url"] = f"http://127.0.0.1:{char}9100/metrics"
    elif where == "pool name":
        document["pools"].append({"name": f"spare{char}gpu", "width": 1})
    elif where == "model name":
        document["models"].append({"name": f"spare{char}model", "base_url": "http://127.0.0.1:8700/v1"})
    elif where == "workflow name":
        document["workflows"].append({"name": f"spare{char}flow", "candidates": ["dialog-27b"]})
    elif where == "previous name":
        document["pools"][0]["previous_names"] = [f"old{char}name"]
    else:
        document["models"][0]["api_key_env"] = f"KEY{char}NAME"
    return document


def test_whitespace_and_control_characters_are_refused_alike_on_both_databases(engine):
    apply_document(engine, example())
    before, version = snapshot(engine), catalog_version(engine)

    for char in BAD_CHARACTERS:
        for where in PLACES:
            with pytest.raises(CatalogInvalid) as refused:
                apply_document(engine, with_character(char, where))
            problems = refused.value.problems
            assert len(problems) == 1, (char, where, problems)
            if "url" in where:
                assert "a URL has no spaces or control characters" in problems[0], problems
                assert f"U+{ord(char):04X}" in problems[0] or "space" in problems[0], problems

    assert snapshot(engine) == before and catalog_version(engine) == version


def test_a_nul_in_a_url_is_refused_by_the_command_with_exit_2_not_a_driver_error(isolated_env, db_url, monkeypatch,
                                                                                 tmp_path):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    path = tmp_path / "nul.yaml"
    path.write_text('models: [{name: m, base_url: "http://127.0.0.1:8700/v1\\0"}]\n')

    result = CliRunner().invoke(main, ["catalog", "apply", str(path)])

    assert result.exit_code == 2, result.output
    assert "models[0].base_url: 'http://127.0.0.1:8700/v1\\x00' has a control character U+0000 at position 24" in result.output
    assert "Traceback" not in result.output and "psycopg" not in result.output


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_a_huge_unknown_key_gives_a_short_line(tmp_path, fmt):
    key = "k" * (1 << 20)
    path = tmp_path / f"huge.{fmt}"
    # (YAML caps an implicit key at 1024 characters; an explicit one has no cap)
    path.write_text(f"? {key}\n: 1\n" if fmt == "yaml" else f"{key} = 1\n"
                    '[[workflows]]\nname = "w"\ncandidates = []\nfailover = { ' + key + " = 1 }\n")

    result = CliRunner().invoke(main, ["catalog", "check", str(path)])

    assert result.exit_code == 2
    assert "unknown key" in result.output
    assert max(len(line) for line in result.output.splitlines()) < 500, len(result.output)


def test_thousands_of_problems_are_a_bounded_message():
    document = {"pools": [{"name": f"bad name {n}", "width": 0} for n in range(5000)]}

    with pytest.raises(CatalogInvalid) as refused:
        apply_document(None, document)  # refused before any database is touched

    message = str(refused.value)
    assert message.startswith("10000 problems in the catalog") and len(message) < 60_000
    assert refused.value.problems[-1] == "... and 9900 more problems (fix these first)"


@pytest.mark.parametrize("fmt, text", [
    ("yaml", "pools: " + "[" * 10_000 + "]" * 10_000 + "\n"),
    ("yaml", "pools:\n" + "".join("  " * level + "- \n" for level in range(1, 200))),
    ("toml", "pools = " + "[" * 10_000 + "]" * 10_000 + "\n"),
    ("toml", "pools = [" + "{a = " * 2_000 + "1" + "}" * 2_000 + "]\n"),
])
def test_deep_nesting_is_refused_with_one_line(tmp_path, fmt, text):
    path = tmp_path / f"deep.{fmt}"
    path.write_text(text)

    result = CliRunner().invoke(main, ["catalog", "check", str(path)])

    assert result.exit_code == 2, result.output
    assert f"nested more than {files.MAX_DEPTH} levels deep" in result.output
    assert "RecursionError" not in result.output and len(result.output) < 300


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "pools: &p [{name: p1, width: 1, previous_names: *p}]\n"])
def test_an_alias_inside_the_value_it_names_is_refused(text):
    with pytest.raises(InvalidInput, match="an alias refers to a value that contains it"):
        parse(text, "yaml")


def test_a_file_far_over_the_cap_is_refused_without_being_read_whole(tmp_path):
    path = tmp_path / "big.yaml"
    with path.open("wb") as file:
        file.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of NULs, on no disk

    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match="the file is over 4 MiB"):
            read_document(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 3 * MAX_DOCUMENT_BYTES, peak


def test_a_device_file_is_refused_at_the_cap(tmp_path):
    # In a child process with its address space capped, so a reader that
    # ignored the cap would fail there (MemoryError) and not strain this machine.
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from lanes.catalog.files import read_document\n"
        "from lanes.errors import InvalidInput\n"
        "try:\n"
        "    read_document('/dev/zero', format='yaml')\n"
        "except InvalidInput as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout.strip() == "/dev/zero: the file is over 4 MiB; a catalog file is a few hundred KiB at most"


def test_a_deep_document_that_came_without_a_file_is_refused_too():
    document: dict = {"pools": [{"name": "p", "width": 1, "controller": {"kind": "off"}}]}
    inner = document["pools"][0]["controller"]
    for _ in range(500):
        inner["x"] = {}
        inner = inner["x"]

    with pytest.raises(CatalogInvalid, match=r"\(top\): nested more than 32 levels deep"):
        apply_document(None, document)
