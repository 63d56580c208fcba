"""Files mean what they say: finite numbers, no repeated keys, no YAML 1.1
number forms, bounded sizes and values, no secrets echoed, known services."""

from __future__ import annotations

import json
import tomllib

import pytest
from click.testing import CliRunner

from lanes.catalog import apply_document, catalog_version, validate
from lanes.catalog.checks import show
from lanes.catalog.files import parse
from lanes.cli import main
from lanes.errors import CatalogInvalid, InvalidInput
from tests.catalog.conftest import EXAMPLE, snapshot

POOL_YAML = """\
pools:
  - name: p1
    width: {width}
    ceiling: 8
"""


def example() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


def refused_without_a_write(engine, document) -> list[str]:
    before, version = snapshot(engine), catalog_version(engine)
    with pytest.raises(CatalogInvalid) as raised:
        apply_document(engine, document)
    assert snapshot(engine) == before and catalog_version(engine) == version
    return raised.value.problems


@pytest.mark.parametrize(
    "fmt, text",
    [
        ("toml", '[[pools]]\nname = "p1"\nwidth = 2\ncontroller = { kind = "utilisation", target = nan }\n'),
        ("yaml", "pools:\n  - name: p1\n    width: 2\n    controller: {kind: utilisation, target: .nan}\n"),
        ("yaml", "pools:\n  - name: p1\n    width: 2\n    controller: {kind: overload, interval_seconds: .inf}\n"),
    ],
)
def test_a_controller_number_that_is_not_finite_is_refused(engine, fmt, text):
    apply_document(engine, {"pools": [{"name": "p1", "width": 2}]})

    problems = refused_without_a_write(engine, parse(text, fmt))

    assert len(problems) == 1 and "is not a finite number" in problems[0], problems
    assert problems[0].startswith("pools[0].controller.")


@pytest.mark.parametrize(
    "text, line",
    [
        ("pools:\n  - name: p1\n    width: 2\n    width: 20\n", 4),
        ("pools:\n  - {name: p1, width: 1}\nmodels: []\npools:\n  - {name: p2, width: 1}\n", 4),
    ],
)
def test_a_repeated_yaml_key_is_refused(text, line):
    with pytest.raises(InvalidInput) as raised:
        parse(text, "yaml", source="fleet.yaml")
    message = str(raised.value)
    assert message.startswith(f"fleet.yaml: not valid YAML (line {line}, column 5)") or message.startswith(
        f"fleet.yaml: not valid YAML (line {line}, column 1)"
    ), message
    assert "duplicate key" in message and "first on line" in message


def test_a_merge_key_is_still_allowed():
    text = "defaults: &d {width: 2, ceiling: 8}\npools:\n  - <<: *d\n    name: p1\n"
    assert parse(text, "yaml")["pools"] == [{"width": 2, "ceiling": 8, "name": "p1"}]


def alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        refs = ",".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    lines.append(f"pools: [{{name: p1, width: 1, previous_names: *a{levels - 1}}}]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_while_reading():
    text = alias_bomb(9)  # ~9^9 values once expanded, in under 1 KB
    assert len(text) < 1000

    with pytest.raises(InvalidInput) as raised:
        parse(text, "yaml", source="bomb.yaml")

    message = str(raised.value)
    assert "alias" in message and len(message) < 200, message


def test_a_value_is_shortened_before_it_is_formatted():
    formatted = []

    class Loud:
        def __repr__(self) -> str:
            formatted.append(1)
            return "x" * 50

    text = show([Loud()] * 10_000)

    assert len(text) <= 63
    assert len(formatted) <= 10  # not one repr per element, then cut


@pytest.mark.parametrize("value", ["010", "0x1F", "1:30", "1_000", "0b11", "1:30.5"])
def test_yaml_1_1_number_forms_are_refused(value):
    with pytest.raises(InvalidInput) as raised:
        parse(POOL_YAML.format(width=value), "yaml", source="f.yaml")
    assert f"{value!r} is a YAML 1.1 number form" in str(raised.value) or "YAML 1.1" in str(raised.value)


def test_quoted_or_decimal_numbers_read_as_written():
    assert parse(POOL_YAML.format(width="10"), "yaml")["pools"][0]["width"] == 10
    assert parse(POOL_YAML.format(width="'010'"), "yaml")["pools"][0]["width"] == "010"
    assert parse("x: 1.5\ny: -2.5e+3\n", "yaml") == {"x": 1.5, "y": -2500.0}


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("pools[0].width", 2**64, "pools[0].width: 18446744073709551616 is too large for a width"),
        ("pools[0].ceiling", 2**31, "is too large for a ceiling (at most 2147483647)"),
        ("workflows[0].reserve_ms", 2**31, "is too large for a reserve"),
        ("workflows[0].deadline_ms", 2**40, "is too large for a deadline in ms"),
        ("services[0].limit", 2**31, "is too large for a limit"),
        ("models[0].base_url", "http://gpu0:8000/" + "v" * 490, "a URL may have at most 500"),
        ("pools[0].metrics_url", "http://gpu0:8000/" + "m" * 490, "a URL may have at most 500"),
    ],
)
def test_values_past_what_every_database_stores_are_refused_alike(engine, path, value, expected):
    apply_document(engine, example())
    document = example()
    section, rest = path.split("[")
    index, key = rest.split("].")
    document[section][int(index)][key] = value

    problems = refused_without_a_write(engine, document)

    assert any(expected in problem for problem in problems), problems


def test_a_yaml_width_of_2_to_the_64_is_one_line_not_a_traceback(engine):
    problems = refused_without_a_write(engine, parse(POOL_YAML.format(width=2**64), "yaml"))
    assert problems == ["pools[0].width: 18446744073709551616 is too large for a width (at most 2147483647)"]


def test_catalog_check_never_prints_a_secret(tmp_path):
    password, key, token = "hunter2-pw", "sk-live-0123456789abcdefXYZ", "tok-987654321"
    document = example()
    document["models"][0]["base_url"] = f"http://admin:{password}@gpu0:8000/v1"
    document["models"][1]["base_url"] = f"http://gpu2:8000/v1?api_key={token}"
    document["models"][7]["api_key_env"] = key
    path = tmp_path / "leaky.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML

    result = CliRunner().invoke(main, ["catalog", "check", str(path)])

    assert result.exit_code == 2
    for secret in (password, key, token):
        assert secret not in result.output and secret[4:] not in result.output
    assert "models[0].base_url: 'http://admin:***@gpu0:8000/v1' holds credentials" in result.output
    assert "models[7].api_key_env: 'sk-'... (27 characters, the rest not shown)" in result.output


def test_a_model_service_must_be_a_service_of_the_file():
    document = example()
    document["models"][0]["service"] = "llm-dialgo"
    document["services"] = [s for s in document["services"] if s["name"] != "privacy"]

    with pytest.raises(CatalogInvalid) as raised:
        validate(document)

    assert [p.split(":")[0] for p in raised.value.problems] == ["models[0].service", "models[6].service"]
    assert "'llm-dialgo' is not a service in this file (known: asr, draw, embed" in raised.value.problems[0]
