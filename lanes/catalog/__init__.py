"""The routing catalog: pools, models, workflows, farm services and events in SQL.

Public names (import them from here):

- :func:`open_catalog` gives an engine whose schema is at head;
- :func:`load_routing` / :func:`refresh` read the catalog as frozen values,
  :func:`catalog_stamp` says whether it changed (:func:`catalog_version` is the
  number people read);
- :func:`apply_document` upserts a declarative document, :func:`export_document`
  gives it back, :func:`read_document` reads a TOML or YAML file;
- :func:`record_event` appends a routing event.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from lanes.catalog.apply import Change, ChangeSet, apply_document
from lanes.catalog.document import CatalogDocument, validate
from lanes.catalog.engine import make_engine
from lanes.catalog.events import EventRecord, recent_events, record_event
from lanes.catalog.export import export_document
from lanes.catalog.files import dump, read_document
from lanes.catalog.migrate import ensure_schema, refuse_missing_file, refuse_missing_schema
from lanes.catalog.pools import set_pool_width
from lanes.catalog.routing import ModelInfo, PoolInfo, RoutingTable, WorkflowRoute, load_routing, refresh
from lanes.catalog.version import CatalogStamp, catalog_stamp, catalog_version
from lanes.settings import Settings


def open_catalog(settings: Settings, *, create: bool = True) -> Engine:
    """An engine on the catalog of ``settings``, its schema created or upgraded to head.

    Without ``LANES_DATABASE_URL`` this is the SQLite file under the state
    directory, created on first use. Opt-in data revisions (the reference
    fleet) are never applied here; see ``lanes db upgrade``.

    ``create=False`` is for commands that only read the catalog: a database
    with no catalog tables (a misspelt SQLite path would otherwise become a new
    empty catalog) is refused with a pointer to ``lanes db upgrade``, and a
    missing SQLite file is not created.
    """
    url = settings.catalog_url()
    if not create:
        refuse_missing_file(url)
    engine = make_engine(url)
    try:
        if not create:
            refuse_missing_schema(engine)
        ensure_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


__all__ = [
    "CatalogDocument",
    "CatalogStamp",
    "Change",
    "ChangeSet",
    "EventRecord",
    "ModelInfo",
    "PoolInfo",
    "RoutingTable",
    "WorkflowRoute",
    "apply_document",
    "catalog_stamp",
    "catalog_version",
    "dump",
    "export_document",
    "load_routing",
    "make_engine",
    "open_catalog",
    "read_document",
    "recent_events",
    "record_event",
    "refresh",
    "set_pool_width",
    "validate",
]
