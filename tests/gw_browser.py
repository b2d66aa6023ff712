"""Headless Debian Chromium through Playwright, with the network cut off (shared by browser tests)."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("GRADWIDGET_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def need_chromium():
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"Chromium not found at {CHROMIUM} (set GRADWIDGET_CHROMIUM)")
    pytest.importorskip("playwright.sync_api")


@contextmanager
def offline_page(viewport=None):
    """A page in a browser context that is offline and aborts every request that is not a local
    file or a data: URI. Yields (page, blocked) where ``blocked`` lists the URLs it refused."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    blocked: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(offline=True, viewport=viewport or {"width": 1280, "height": 900})

            def route(r):
                url = r.request.url
                if url.startswith(("file:", "data:")):
                    r.continue_()
                else:
                    blocked.append(url)
                    r.abort()

            context.route("**/*", route)
            page = context.new_page()
            yield page, blocked
        finally:
            browser.close()


IMAGES_JS = """() => Array.from(document.images).map(i => ({
  cls: i.className, alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
  visible: i.getBoundingClientRect().height > 0 && getComputedStyle(i).visibility !== 'hidden'
           && i.offsetParent !== null}))"""

TABLE_LAYERS_JS = """() => Array.from(document.querySelectorAll('table.gradwidget-health tr[data-layer]'))
  .filter(tr => tr.offsetParent !== null).map(tr => tr.dataset.layer)"""
