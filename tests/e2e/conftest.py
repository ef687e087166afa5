"""Real-browser tests: headless Chromium (Debian's ``chromium``) driven by Playwright.

Playwright never downloads a browser here; it launches ``/usr/bin/chromium``.
When that browser (or the ``playwright`` package) is missing, every test in
this folder is skipped with a loud reason naming the fix (``make browser``,
which ``make test`` runs first, installs it when it can).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("ATLAS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def _skip_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -r requirements-dev.txt)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return (
            f"no Chromium at {CHROMIUM}: install Debian's package "
            "(`make browser` does it as root: apt-get install -y chromium)"
        )
    return None


@pytest.fixture(scope="session")
def browser(django_db_setup: Any) -> Iterator[Any]:
    reason = _skip_reason()
    if reason:
        print(f"\n!!! E2E BROWSER TESTS SKIPPED: {reason} !!!")
        pytest.skip(f"E2E BROWSER TESTS SKIPPED: {reason}")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, and
    # Django refuses ORM calls beside a running loop. Every ORM call here is
    # synchronous and in this thread, so the guard is lifted while it runs.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    # Start with the admin's navigation sidebar collapsed: wide tables fit.
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def screenshot(page: Any):
    """``screenshot("name")`` writes docs/screenshots/name.png when ATLAS_SCREENSHOTS=1."""

    def take(name: str) -> None:
        if os.environ.get("ATLAS_SCREENSHOTS") == "1":
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    return take
