"""A page opened in a real browser (headless Chromium through Playwright): what its console said,
what it tried to fetch, a screenshot, and the marks of its SVG charts.

    visit = open_page(Path("report.html"), screenshot=Path("report.png"))
    assert not visit.console_errors and not visit.outside_requests

The browser is Debian's `chromium` (`apt-get install chromium`) or any Chromium on PATH, else
the one `playwright install chromium` downloads; `find_chromium` says which, or None. Used by
tests/test_report_browser.py and bench/report_screenshot.py (the README's picture).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Error

# Every <svg> of the page: its size as drawn, and how many of its marks carry a number.
_CHARTS_JS = """() => Array.from(document.querySelectorAll('svg')).map(svg => {
  const box = svg.getBoundingClientRect();
  return {label: svg.getAttribute('aria-label'), width: box.width, height: box.height,
          marks: svg.querySelectorAll('[data-value]').length};
})"""

# The charts' name labels (`text.name`) as drawn: where each starts against its chart's left
# edge (a label cut at the left starts before it), and the full name its <title> holds.
_NAMES_JS = """() => Array.from(document.querySelectorAll('svg text.name')).map(text => {
  const svg = text.closest('svg').getBoundingClientRect();
  const title = text.querySelector('title');
  return {left: text.getBoundingClientRect().left, svg_left: svg.left,
          title: title ? title.textContent : ''};
})"""


@dataclass
class Visit:
    console_errors: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)  # anything not the page itself
    charts: list[dict] = field(default_factory=list)  # {label, width, height, marks}
    text_boxes: list[dict] = field(default_factory=list)  # name labels: {left, svg_left, title}
    screenshot: bytes = b""
    title: str = ""


def find_chromium() -> str | None:
    """A Chromium to drive: one on PATH, else Playwright's own download; None if neither."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            path = playwright.chromium.executable_path
    except Exception:  # noqa: BLE001 - no Playwright, or no browser it can name
        return None
    return path if Path(path).is_file() else None


def open_page(
    page_path: Path, *, screenshot: Path | None = None, width: int = 1100, full_page: bool = True
) -> Visit:
    """Load the file at `page_path` headless, every request to anything but that file refused
    (and recorded); a screenshot of the whole page, written to `screenshot` if given."""
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    if executable is None:
        raise RuntimeError("no Chromium: `apt-get install chromium`, or `playwright install`")
    url = page_path.resolve().as_uri()
    visit = Visit()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": 800})

            def console(message: ConsoleMessage) -> None:
                if message.type == "error":
                    visit.console_errors.append(message.text)

            def page_error(error: Error) -> None:
                visit.console_errors.append(str(error))

            page.on("console", console)
            page.on("pageerror", page_error)

            def only_the_page(route) -> None:
                if route.request.url == url:
                    route.continue_()
                else:
                    visit.outside_requests.append(route.request.url)
                    route.abort()

            page.route("**/*", only_the_page)
            page.goto(url, wait_until="load")
            visit.title = page.title()
            visit.charts = page.evaluate(_CHARTS_JS)
            visit.text_boxes = page.evaluate(_NAMES_JS)
            visit.screenshot = page.screenshot(full_page=full_page, type="png")
        finally:
            browser.close()
    if screenshot is not None:
        screenshot.write_bytes(visit.screenshot)
    return visit
