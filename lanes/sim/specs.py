"""Models to simulate, from ``NAME:CAPACITY[:SERVICE_MS]`` specs or a catalog file.

The catalog file is read here with ``tomllib``/``yaml`` on purpose: the
simulator must run without the catalog package (or a database), so it reads
only what it needs: ``[[pools]] name, width`` and ``[[models]] name,
base_url, kind, pool``. Every model whose ``base_url`` is on this machine
(127.0.0.1, localhost, ::1) is served on that URL's port with its pool's
width as capacity; other models are reported as skipped.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from lanes.errors import InvalidInput
from lanes.sim.model import SimModel

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
DEFAULT_CAPACITY = 16
SPEC_HELP = "NAME:CAPACITY[:SERVICE_MS], e.g. chat-small:4:50"


def parse_model_spec(spec: str, template: SimModel | None = None) -> SimModel:
    """``NAME:CAPACITY[:SERVICE_MS]``; a NAME may itself contain colons
    (``qwen3:8b:4``): the numbers are taken from the right."""
    parts = spec.split(":")
    service_ms = None
    if len(parts) >= 3 and _int(parts[-2]) is not None and _float(parts[-1]) is not None:
        name, capacity, service_ms = ":".join(parts[:-2]), _int(parts[-2]), _float(parts[-1])
    elif len(parts) >= 2 and _int(parts[-1]) is not None:
        name, capacity = ":".join(parts[:-1]), _int(parts[-1])
    else:
        raise InvalidInput(f"bad model spec {spec!r}: expected {SPEC_HELP}")
    if not name:
        raise InvalidInput(f"bad model spec {spec!r}: the name is empty (expected {SPEC_HELP})")
    base = template or SimModel(name=name)
    changes: dict[str, Any] = {"name": name, "capacity": capacity}
    if service_ms is not None:
        changes["service_ms"] = service_ms
    return replace(base, **changes)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class CatalogModels:
    models: list[SimModel]
    skipped: list[str]  # "name (base_url)" of models not on this machine


def read_catalog(path: Path) -> dict[str, Any]:
    """The catalog file as a mapping; a missing or malformed file is bad input."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InvalidInput(f"catalog file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise InvalidInput(f"catalog file {str(path)!r} cannot be read: {exc.strerror}") from None
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise InvalidInput(f"catalog file {str(path)!r}: unknown format (use .toml, .yaml or .yml)")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise InvalidInput(f"catalog file {str(path)!r} is not valid {suffix[1:].upper()}: {first}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"catalog file {str(path)!r} must hold a table/mapping at the top")
    return data


def catalog_models(path: Path, template: SimModel | None = None) -> CatalogModels:
    data = read_catalog(path)
    widths: dict[str, int] = {}
    for i, pool in enumerate(_list(data, "pools", path)):
        name, width = _field(pool, "name", f"pools[{i}]", path), pool.get("width")
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise InvalidInput(f"{path}: pools[{i}].width: {width!r} is not a width >= 1")
        widths[name] = width
    base = template or SimModel(name="_")
    models, skipped = [], []
    for i, entry in enumerate(_list(data, "models", path)):
        where = f"models[{i}]"
        name, base_url = _field(entry, "name", where, path), _field(entry, "base_url", where, path)
        url = urlsplit(base_url)
        try:
            port = url.port or (443 if url.scheme == "https" else 80)
        except ValueError:
            raise InvalidInput(f"{path}: {where}.base_url: {base_url!r} has a bad port") from None
        if url.hostname not in LOCAL_HOSTS or url.scheme != "http":
            skipped.append(f"{name} ({base_url})")
            continue
        kind = entry.get("kind", "chat")
        if kind not in ("chat", "embedding"):
            raise InvalidInput(f"{path}: {where}.kind: {kind!r} is not chat or embedding")
        pool = entry.get("pool")
        if pool is not None and pool not in widths:
            raise InvalidInput(f"{path}: {where}.pool: {pool!r} is not a pool in the file (known: {', '.join(sorted(widths))})")
        capacity = widths[pool] if pool is not None else DEFAULT_CAPACITY
        models.append(replace(base, name=name, kind=kind, capacity=capacity, port=port, device=pool))
    if not models:
        raise InvalidInput(f"{path}: no model has a base_url on this machine (127.0.0.1 or localhost) to simulate")
    return CatalogModels(models, skipped)


def _list(data: dict, key: str, path: Path) -> list[dict]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidInput(f"{path}: {key} must be a list of tables ([[{key}]])")
    return value


def _field(entry: dict, key: str, where: str, path: Path) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{path}: {where}.{key}: {value!r} must be a non-empty string")
    return value
