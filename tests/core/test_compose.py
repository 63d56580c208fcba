"""docker-compose.yml cannot run here (no Docker engine); check what can be checked."""

from pathlib import Path

import yaml

from lanes.catalog import read_document
from lanes.catalog.document import validate

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_the_stack_has_its_services_and_every_image_is_built_or_named():
    services = compose()["services"]
    for name in ("redis", "postgres", "migrate", "sim", "flower"):
        assert name in services
    for name, service in services.items():
        assert "image" in service or "build" in service, name
    assert (ROOT / "Dockerfile").exists()


def test_there_is_one_worker_per_fleet_of_the_example_catalog():
    document = validate(read_document(ROOT / "examples" / "aifarm.toml"))
    primary_pools = set()
    models = {m.name: m for m in document.models}
    for workflow in document.workflows:
        primary_pools.add(models[workflow.candidates[0]].pool or "hosted")
    fleets = set()
    for service in compose()["services"].values():
        command = service.get("command") or []
        if command[:2] == ["lanes", "worker"]:
            fleets.add(command[command.index("--fleet") + 1])
    assert fleets == primary_pools


def test_redis_never_evicts_lane_keys_and_files_named_in_commands_exist():
    services = compose()["services"]
    assert "noeviction" in services["redis"]["command"]
    for service in services.values():
        for word in " ".join(service.get("command") or []).split():
            if word.startswith("/app/"):
                assert (ROOT / word.removeprefix("/app/")).exists(), word
