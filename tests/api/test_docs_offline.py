"""/docs renders in a real browser with no network but the API's own port."""

from __future__ import annotations

import pytest

from tests.api.conftest import Served
from tests.flower.browser import artifacts_dir, chromium
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_swagger_ui_renders_every_endpoint_from_the_apis_own_assets(make_api, tmp_path):
    server = Served(make_api().app)
    driver = None
    try:
        driver = chromium(tmp_path / "profile")
        driver.get(server.url + "/docs")
        text = eventually(lambda: (t := driver.find_element("tag name", "body").text) and "/v1/tasks" in t and t,
                          timeout=60, interval=0.5, what="Swagger UI to render the endpoints")
        driver.save_screenshot(str(artifacts_dir().parent / "api-docs.png"))
        assert "/v1/pools/{name}" in text and "/readyz" in text
        loaded = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert loaded and all(url.startswith(server.url) for url in loaded), loaded
    finally:
        if driver is not None:
            driver.quit()
        server.stop()
