"""The report of a real tuning run (a one-layer MLP: tune-model for 3 trials, then build-model
--compare), opened in headless Chromium: no console error, no request leaves the page, the
screenshot is not blank, and every chart is drawn with its marks. Skipped only where no Chromium
exists (`.ci/run` installs Debian's). Also: the README's picture is of the current template."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from schedlang.report.page import write_report
from schedlang.testing.browser import find_chromium, open_page

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import report_screenshot  # noqa: E402

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium to open the report in: `apt-get install chromium` (as .ci/run does) or "
    "`playwright install chromium`",
)


@pytest.fixture(scope="module")
def page(tmp_path_factory, monkeypatch_module) -> Path:
    folder = tmp_path_factory.mktemp("report")
    monkeypatch_module.chdir(ROOT)
    report_screenshot.make_database(folder / "tune.db", trials=3)
    contents = write_report(folder / "tune.db", folder / "report.html")
    assert contents.problems == [] and len(contents.models) == 1
    return folder / "report.html"


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_report_of_a_real_run_has_its_tir_and_model(page: Path) -> None:
    html = page.read_text()
    assert "<details><summary>lowered TIR</summary>" in html
    assert "prim_func" in html  # the scheduled function, highlighted as Python
    assert "model mlp on llvm" in html and "default (tvm.compile)" in html
    assert "fused_matmul_add" in html and "unscheduled" in html


@needs_chromium
def test_the_report_opens_in_chromium_offline_with_its_charts_drawn(page: Path) -> None:
    from PIL import Image

    visit = open_page(page)
    assert visit.console_errors == []
    assert visit.outside_requests == []
    assert visit.title == "schedlang report: tune.db"
    labels = [chart["label"] for chart in visit.charts]
    assert labels[:4] == [
        "time per function of mlp",
        "estimated latency of mlp against trials",
        "trials per function of mlp",
        "end-to-end latency of mlp",
    ]
    assert labels[4].startswith("tuning curve of fused_matmul_add on llvm")
    functions, _, trials, *_ = visit.charts
    for chart in visit.charts:
        assert chart["width"] > 100 and chart["height"] > 30, chart
        # bars or trials, each with its number: one bar per function for the model's
        assert chart["marks"] >= (1 if chart in (functions, trials) else 2), chart
    # every function's bar label fits inside its chart: none cut at the left
    assert visit.text_boxes and all(
        box["left"] >= box["svg_left"] - 0.5 for box in visit.text_boxes
    )
    assert all(box["title"] for box in visit.text_boxes)  # the full name on hover
    with Image.open(io.BytesIO(visit.screenshot)) as shot:
        assert shot.width >= 1000 and shot.height > 1000
        low, high = shot.convert("L").getextrema()
        assert high - low > 100  # not one colour: something is drawn


def test_the_readme_picture_is_of_the_current_template() -> None:
    from PIL import Image

    pictures = sorted((ROOT / "docs").glob("report*.png"))
    assert report_screenshot.PICTURE in pictures
    for path in pictures:  # the README's, and docs/'s of a real model's database
        with Image.open(path) as picture:
            stamp = picture.text.get("drawn_by")
        assert stamp == report_screenshot.drawn_by(), (
            f"docs/{path.name} shows an older report template or charts: run "
            "`python bench/report_screenshot.py` (with `--db` and `--out` for a picture of a "
            "model's database) and commit the picture"
        )
    assert "docs/report.png" in (ROOT / "README.md").read_text()
