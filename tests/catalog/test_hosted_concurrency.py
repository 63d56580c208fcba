"""A hosted model's concurrency limit: where it may be set, and that it is kept."""

from __future__ import annotations

import pytest

from lanes.catalog import apply_document, load_routing
from lanes.catalog.export import export_document
from lanes.errors import CatalogInvalid


def document(**hosted) -> dict:
    return {
        "pools": [{"name": "gpu", "width": 2}],
        "models": [
            {"name": "local", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu"},
            {"name": "hosted", "base_url": "https://api.example.com/v1", **hosted},
        ],
        "workflows": [{"name": "chat", "candidates": ["local", "hosted"]}],
    }


def test_a_hosted_models_limit_is_routed_and_exported(engine):
    apply_document(engine, document(concurrency=40))
    assert load_routing(engine).models["hosted"].concurrency == 40
    assert load_routing(engine).models["local"].concurrency is None
    exported = {m["name"]: m for m in export_document(engine)["models"]}
    assert exported["hosted"]["concurrency"] == 40 and "concurrency" not in exported["local"]


@pytest.mark.parametrize("value", [0, -3, 1_000_001, "8", 2.5])
def test_a_limit_out_of_range_or_not_an_integer_is_refused_with_its_value(engine, value):
    with pytest.raises(CatalogInvalid) as refused:
        apply_document(engine, document(concurrency=value))
    assert "concurrency" in str(refused.value)
    assert load_routing(engine).models == {}


def test_a_pooled_model_takes_no_limit_of_its_own(engine):
    doc = document()
    doc["models"][0]["concurrency"] = 4
    with pytest.raises(CatalogInvalid) as refused:
        apply_document(engine, doc)
    text = str(refused.value)
    assert "models[0].concurrency: 4 on model 'local', which has pool 'gpu'" in text and "drop concurrency" in text
