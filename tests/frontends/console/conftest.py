"""A headless Chromium for the console's browser tests: Debian's `chromium` (installed by
`make browser`, i.e. tests/setup_browser.sh) driven by Playwright's Python package, or the
binary $NAIAD_CHROMIUM names."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: Screenshots of each page (git-ignored); the README shows how to open the console instead.
SCREENSHOTS = ROOT / "tests" / ".screenshots"
_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    named = os.environ.get("NAIAD_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _missing(what: str) -> None:
    """No browser: fail under CI (make installs one, so its absence is a broken install), else
    skip with a message that cannot be missed."""
    message = (f"NO BROWSER — the web console's browser tests did NOT run: {what}. "
               "Run `make browser` (tests/setup_browser.sh) or set NAIAD_CHROMIUM.")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread while it
    is started, and later tests' asyncio.run() must not find one."""
    path = chromium_path()
    if path is None:
        _missing("no chromium binary found")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (its own context: no cache, no session storage), 1400x900."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture(scope="session")
def screenshot() -> Any:
    """`screenshot(page, name)` writes tests/.screenshots/console-<name>.png."""

    def take(page: Any, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"console-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
