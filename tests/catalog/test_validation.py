"""Bad catalog documents: every problem is named with its key path and value,
and the database is left exactly as it was (rows and version)."""

from __future__ import annotations

import copy
import tomllib

import pytest

from lanes.catalog import apply_document, catalog_version, read_document, validate
from lanes.catalog.files import parse
from lanes.errors import CatalogInvalid, InvalidInput
from tests.catalog.conftest import EXAMPLE, snapshot


def example() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


def edit(path: str, value) -> callable:
    """A change to the example: set the value at ``path`` ('pools[2].width')."""

    def change(doc: dict) -> None:
        *parents, last = _parts(path)
        target = doc
        for part in parents:
            target = target[part]
        target[last] = value

    return change


def drop(path: str) -> callable:
    def change(doc: dict) -> None:
        *parents, last = _parts(path)
        target = doc
        for part in parents:
            target = target[part]
        del target[last]

    return change


def _parts(path: str) -> list:
    parts = []
    for piece in path.replace("]", "").split("."):
        name, *indexes = piece.split("[")
        parts.append(name)
        parts.extend(int(i) for i in indexes)
    return parts


def duplicate(section: str, index: int) -> callable:
    def change(doc: dict) -> None:
        doc[section].append(copy.deepcopy(doc[section][index]))

    return change


BAD = {
    "unknown model in a workflow": (
        edit("workflows[0].candidates[1]", "nope"),
        "workflows[0].candidates[1]: 'nope' is not a model in this file (known: dialog-27b,",
    ),
    "width below 1": (edit("pools[2].width", 0), "pools[2].width: 0 is not a width >= 1"),
    "negative reserve": (edit("workflows[0].reserve_ms", -1), "workflows[0].reserve_ms: -1 is not a reserve >= 0"),
    "unknown priority": (
        edit("workflows[1].priority", "urgent"),
        "workflows[1].priority: 'urgent' is not a priority (known: interactive, user_tool, background)",
    ),
    "priority given as a number": (edit("workflows[1].priority", 1), "workflows[1].priority: 1 is not a priority"),
    "duplicate pool names": (
        duplicate("pools", 0),
        "pools[5].name: 'aifarm-gpu0-dialog' is already the name of pools[0]",
    ),
    "duplicate workflow names": (
        duplicate("workflows", 3),
        "workflows[11].name: 'media_optimizer' is already the name of workflows[3]",
    ),
    "floor above ceiling": (
        lambda d: d["pools"][0].update(floor=5, ceiling=2, width=2),
        "pools[0].floor: 5 is above ceiling 2",
    ),
    "width outside floor..ceiling": (edit("pools[0].width", 9), "pools[0].width: 9 is outside floor..ceiling 1..8"),
    "unknown controller kind": (
        edit("pools[1].controller", {"kind": "pid"}),
        "pools[1].controller.kind: 'pid' is not a controller kind (known: off, overload,",
    ),
    "unknown controller parameter": (
        edit("pools[1].controller", {"kind": "overload", "gain": 2}),
        "pools[1].controller.gain: 2 is not a parameter of controller 'overload' (known: cut_factor,",
    ),
    "controller parameter out of range": (
        edit("pools[1].controller", {"kind": "overload", "cut_factor": 1.5}),
        "pools[1].controller.cut_factor: 1.5 is outside (0, 1]",
    ),
    "one controller kind twice": (
        edit("pools[1].controller", [{"kind": "vllm"}, {"kind": "vllm"}]),
        "pools[1].controller[1].kind: 'vllm' is named twice",
    ),
    "a bad status in a list": (
        edit("pools[1].controller", [{"kind": "vllm"}, {"kind": "overload", "statuses": [529, 700]}]),
        "pools[1].controller[1].statuses: 700 in [529, 700] is not an integer within [100, 599]",
    ),
    "controller without a kind": (edit("pools[1].controller", {"cut_factor": 1}), "pools[1].controller.kind: missing"),
    "base URL without a scheme": (
        edit("models[0].base_url", "127.0.0.1:8700/v1"),
        "models[0].base_url: '127.0.0.1:8700/v1' is not an http(s) URL with a host",
    ),
    "credentials in a URL": (
        edit("models[0].base_url", "http://user:secret@host/v1"),
        "models[0].base_url: 'http://user:***@host/v1' holds credentials",
    ),
    "bad metrics URL": (edit("pools[0].metrics_url", "ftp://x/metrics"), "pools[0].metrics_url: 'ftp://x/metrics'"),
    "farm model without a pool": (
        drop("models[1].pool"),
        "models[1].pool: missing; model 'utility-14b' is served by farm service 'llm-utility', so it needs a pool",
    ),
    "unknown pool": (
        edit("models[1].pool", "gpu9"),
        "models[1].pool: 'gpu9' is not a pool in this file (known: aifarm-embedder,",
    ),
    "bad model kind": (
        edit("models[0].kind", "vision"),
        "models[0].kind: 'vision' is not a kind (known: chat, embedding)",
    ),
    "empty candidates": (edit("workflows[4].candidates", []), "workflows[4].candidates: [] is empty"),
    "duplicate candidate": (
        edit("workflows[0].candidates", ["dialog-27b", "utility-14b", "dialog-27b"]),
        "workflows[0].candidates[2]: 'dialog-27b' is already candidates[0]",
    ),
    "embedding fallback for a chat workflow": (
        edit("workflows[0].candidates", ["dialog-27b", "embed-m3"]),
        "workflows[0].candidates[1]: 'embed-m3' is an embedding model but the primary 'dialog-27b' is a chat model",
    ),
    "zero timeout": (edit("models[2].timeout_ms", 0), "models[2].timeout_ms: 0 is not a timeout_ms in 1..3600000"),
    "timeout as text": (edit("models[2].timeout_ms", "30s"), "models[2].timeout_ms: '30s' is not an integer"),
    "reserve as long as the deadline": (
        edit("workflows[0].reserve_ms", 120000),
        "workflows[0].reserve_ms: 120000 leaves the primary no time within deadline_ms 120000",
    ),
    "unknown key in an item": (
        lambda d: d["pools"][3].update(widht=8),
        "pools[3].widht: unknown key (known: name, width, floor, ceiling,",
    ),
    "unknown top-level key": (
        lambda d: d.update(pool=[]),
        "pool: unknown key (known: pools, models, workflows, services)",
    ),
    "missing required key": (drop("services[0].limit"), "services[0].limit: missing (required)"),
    "service limit zero": (edit("services[1].limit", 0), "services[1].limit: 0 is not a limit >= 1"),
    "a key where a key name belongs": (
        edit("models[7].api_key_env", "sk-live-abc123"),
        "models[7].api_key_env: 'sk-'... (14 characters, the rest not shown) is not an environment variable name",
    ),
    "name with spaces": (edit("workflows[2].name", "you tube"), "workflows[2].name: 'you tube' is not a valid name"),
    "boolean as a width": (edit("pools[0].width", True), "pools[0].width: True is not an integer"),
    "section that is not a list": (edit("services", {"name": "x"}), "services: {'name': 'x'} is not a list"),
    "a model's farm service not in the file": (
        edit("models[0].service", "llm-dialgo"),
        "models[0].service: 'llm-dialgo' is not a service in this file (known: asr, draw, embed, llm-dialog,",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_document_names_the_problem_and_changes_nothing(engine, case):
    apply_document(engine, example())
    before, version = snapshot(engine), catalog_version(engine)
    document = example()
    change, expected = BAD[case]
    change(document)

    with pytest.raises(CatalogInvalid) as raised:
        apply_document(engine, document)

    assert any(expected in problem for problem in raised.value.problems), raised.value.problems
    assert "nothing was written" in str(raised.value)
    assert snapshot(engine) == before
    assert catalog_version(engine) == version


def test_every_problem_is_reported_at_once_in_file_order():
    document = example()
    document["workflows"][0]["reserve_ms"] = -5
    document["pools"][4]["width"] = 0
    document["models"][0]["kind"] = "vision"

    with pytest.raises(CatalogInvalid) as raised:
        validate(document)

    assert [p.split(":")[0] for p in raised.value.problems] == [
        "pools[4].width",
        "models[0].kind",
        "workflows[0].reserve_ms",
    ]


def test_a_document_that_is_not_a_table_is_refused():
    with pytest.raises(CatalogInvalid, match=r"\(top\): \[1, 2\] is not a table"):
        validate([1, 2])


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("bad.toml", "[[pools]\nname = 'x'", "bad.toml: not valid TOML"),
        ("bad.yaml", "pools: [\n", "bad.yaml: not valid YAML (line 2, column 1)"),
        ("bad.json", "{}", "unknown file type '.json'"),
    ],
)
def test_an_unparseable_file_is_one_line_of_input_error(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InvalidInput) as raised:
        read_document(path)
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InvalidInput, match="cannot read the file"):
        read_document(tmp_path / "nope.toml")


def test_yaml_spellings_that_are_not_strings_are_refused():
    # YAML 1.1 reads a bare `off` as false and `0x10` as 16.
    document = parse("pools:\n- {name: a, width: 1, controller: {kind: off}}\n", "yaml")
    with pytest.raises(CatalogInvalid, match=r"pools\[0\].controller.kind: False is not a controller kind"):
        validate(document)
