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


# Services that run once and exit; every other one runs for good.
ONE_SHOTS = {"migrate", "catalog", "lanes"}


def long_running() -> dict:
    return {name: s for name, s in compose()["services"].items() if name not in ONE_SHOTS}


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy():
    for name, service in long_running().items():
        assert service.get("healthcheck", {}).get("test"), name
        assert service.get("restart") == "unless-stopped", name
    assert long_running()["api"]["healthcheck"]["test"][-1].endswith("/readyz")


def test_workers_get_the_longest_model_timeout_to_finish_their_calls():
    document = validate(read_document(ROOT / "deploy" / "catalog.toml"))
    longest = max(m.timeout_ms for m in document.models) / 1000
    for name, service in compose()["services"].items():
        if (service.get("command") or [None])[0] == "lanes" and "worker" in service["command"]:
            grace = service["stop_grace_period"]
            assert grace.endswith("s") and float(grace[:-1]) >= longest, (name, grace, longest)


def test_services_have_their_own_network_names_and_the_catalog_points_at_sim():
    for name, service in compose()["services"].items():
        assert "network_mode" not in service, name
    document = validate(read_document(ROOT / "deploy" / "catalog.toml"))
    assert {m.base_url for m in document.models} == {"http://sim:8700/v1"}
    example = validate(read_document(ROOT / "examples" / "aifarm.toml"))
    assert [p.name for p in document.pools] == [p.name for p in example.pools], "the stack runs the example fleet"


def test_the_catalog_is_applied_only_to_an_empty_database_unless_asked():
    services = compose()["services"]
    migrate = " ".join(services["migrate"]["command"])
    assert "catalog apply --if-empty /app/deploy/catalog.toml" in migrate
    assert services["catalog"]["profiles"] == ["catalog"]
    assert "--if-empty" not in " ".join(services["catalog"]["command"])


def test_the_memory_gate_is_set_and_workers_have_a_memory_limit():
    services = compose()["services"]
    for name, service in services.items():
        command = service.get("command") or []
        if command[:2] == ["lanes", "worker"] or command[:3] == ["lanes", "memory", "worker"]:
            assert float(service["environment"]["LANES_MEMORY_GATE_HIGH"]) < 1, name
            assert service["mem_limit"], name


def test_state_lives_on_named_volumes_and_ports_are_published_on_loopback_unless_asked():
    document = compose()
    assert "pgdata:/var/lib/postgresql/data" in document["services"]["postgres"]["volumes"]
    assert {"pgdata", "prometheus-data", "grafana-data"} <= set(document["volumes"])
    published = [port for s in document["services"].values() for port in s.get("ports", [])]
    assert published and all(port.startswith("${LANES_PUBLISH_ADDRESS:-127.0.0.1}:") for port in published)
    assert "lanes:lanes" not in (ROOT / "docker-compose.yml").read_text(), "no hard-coded database password"


def test_the_build_context_leaves_out_what_the_image_does_not_need():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for entry in (".git", ".venv*", "tests", ".env", "**/__pycache__"):
        assert entry in ignored, entry
    for needed in ("lanes", "workers", "scheduler", "migrations", "examples", "README.md", "pyproject.toml"):
        assert needed not in ignored, needed


def test_the_image_gets_every_file_lanes_reads_at_run_time():
    """`pip install .` (the Dockerfile's) ships only the package data pyproject names."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lanes"]
    shipped = {path for pattern in data for path in (ROOT / "lanes").glob(pattern)}
    for needed in ("flower/templates/*.html", "lane/scripts/*.lua", "routing/scripts/*.lua"):
        files = list((ROOT / "lanes").glob(needed))
        assert files and set(files) <= shipped, needed
    assert "COPY deploy/catalog.toml" in (ROOT / "Dockerfile").read_text()
