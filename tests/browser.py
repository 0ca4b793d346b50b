"""Headless Chromium through Playwright: open a page, wait for what it shows, take a screenshot.

Playwright's own browser downloads are not reachable from every machine, so this drives the system's Debian
`chromium` (`apt-get install chromium`; `make test` installs it when missing).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Locator, Page, expect, sync_playwright

TIMEOUT_S = 30.0


def chromium_path() -> str | None:
    return shutil.which("chromium")


@contextmanager
def chromium_page(init_scripts: Sequence[str] = (), width: int = 1400, height: int = 900) -> Iterator[Page]:
    """A fresh page in headless Chromium; each of `init_scripts` runs before any page script, on every load."""
    executable = chromium_path()
    if executable is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as playwright:
        # --no-sandbox: the tests run as root, where Chromium refuses to start with its sandbox.
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(TIMEOUT_S * 1000)
            for script in init_scripts:
                page.add_init_script(script)
            yield page
        finally:
            browser.close()


def visit(page: Page, url: str) -> None:
    """Open `url` and fail on an HTTP error; single-page apps keep loading after this, so wait on content next."""
    response = page.goto(url, wait_until="domcontentloaded")
    status = response.status if response is not None else "no response"
    assert response is not None and response.ok, f"GET {url}: {status}"


def shows(target: Page | Locator, text: str, exact: bool = True, timeout_s: float = TIMEOUT_S) -> Locator:
    """Wait until `text` is visible in `target` (a page or a part of it) and return its first match."""
    found = target.get_by_text(text, exact=exact).first
    expect(found).to_be_visible(timeout=timeout_s * 1000)
    return found


def screenshot(page: Page, path: Path, copy_to: Path | None = None) -> Path:
    """Save a full-page PNG at `path`, and a copy in the directory `copy_to` if given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy_to / path.name)
    return path


@contextmanager
def screenshot_after(page: Page, path: Path, copy_to: Path | None = None) -> Iterator[None]:
    """Take the screenshot when the block ends, passed or failed: a failed check leaves the page it looked at."""
    try:
        yield
    finally:
        screenshot(page, path, copy_to)
