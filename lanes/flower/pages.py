"""Flower's pages as Lanes shows them, through Flower's own handlers and templates.

- :class:`LanesView`: the Lanes page (``/lanes``, in the navigation after
  Broker): a row per catalog pool (:func:`lanes.ops.lanes_page.lanes_page`).
- :class:`LanesTemplates`: Flower's template loader with Lanes' own
  templates first, the navigation's Lanes link, and the worker page without
  the pool controls Lanes workers cannot honour: the fleet sizes its worker
  from the lane's width, so Grow, Shrink, Autoscale and Restart Pool would
  either fail or be undone at the next resize.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from flower.views import BaseHandler
from tornado import template, web
from tornado.ioloop import IOLoop

OWN_TEMPLATES = Path(__file__).parent / "templates"

_LANES_LINK = """
        <li class="nav-item">
          <a class="nav-link{% if active_tab == 'lanes' %} active{% end %}"
            href="{{ reverse_url('lanes') }}"
            {% if active_tab == 'lanes' %}aria-current="page"{% end %}>Lanes</a>
        </li>"""
_BROKER_ITEM = re.compile(r"(>Broker</a>\s*</li>)")
_POOL_CONTROLS = re.compile(r"\{% if not read_only %\}\s*<section class=\"worker-panel worker-controls-panel\".*?"
                            r"</section>\s*\{% end %\}", re.S)
_POOL_RESTART = re.compile(r"<li>\s*<button id=\"worker-pool-restart\".*?</li>", re.S)


def navbar_with_lanes(text: str) -> str:
    changed, count = _BROKER_ITEM.subn(lambda m: m.group(1) + _LANES_LINK, text, count=1)
    if count != 1:
        raise RuntimeError("Flower's navbar.html has no Broker link to put the Lanes link after")
    return changed


def worker_page_without_pool_controls(text: str) -> str:
    text, controls = _POOL_CONTROLS.subn("", text)
    text, restart = _POOL_RESTART.subn("", text)
    if controls != 1 or restart != 1:
        raise RuntimeError("Flower's worker.html no longer has the pool controls Lanes hides")
    return text


class LanesTemplates(template.Loader):
    """Flower's templates, with Lanes' own first and two of Flower's adjusted."""

    EDITS = {"navbar.html": navbar_with_lanes, "worker.html": worker_page_without_pool_controls}

    def _create_template(self, name: str) -> template.Template:
        own = OWN_TEMPLATES / name
        path = own if own.exists() else Path(self.root) / name
        text = path.read_text(encoding="utf-8")
        if not own.exists() and name in self.EDITS:
            text = self.EDITS[name](text)
        return template.Template(text, name=name, loader=self)


class LanesView(BaseHandler):
    @web.authenticated
    async def get(self):
        page = await IOLoop.current().run_in_executor(None, self.application.lanes_page)
        self.render("lanes.html", page=page)


def template_path() -> str:
    return os.fspath(OWN_TEMPLATES)
