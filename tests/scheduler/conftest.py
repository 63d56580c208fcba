from tests.memory.conftest import memory_engine  # noqa: F401  (the fixture, shared with tests/memory)
