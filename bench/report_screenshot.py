"""The README's picture of a report (docs/report.png): a small real tuning run (a one-layer MLP
tuned for 6 trials, then timed beside its baselines), its report, and a screenshot of the report's
top in headless Chromium. The picture keeps a hash of the page's template and charts (`drawn_by`,
a PNG text field); tests/test_report_browser.py fails when they changed since, and says to run:

    python bench/report_screenshot.py   # half a minute; needs chromium (apt-get install chromium)

`--db FILE --out PICTURE` takes the picture of an existing database's report instead (docs/'s
ResNet-18 one: bench/bench_early_stop.py's database of a default run); the test checks every
docs/report*.png.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PICTURE = ROOT / "docs" / "report.png"
MLP = ["examples/models/mlp.py", "-D", "layers=1", "-D", "batch=8", "-D", "features=32"]


def drawn_by() -> str:
    """A hash of what decides how a report looks: its template and its charts."""
    import hashlib

    digest = hashlib.sha256()
    for part in ("report.html.j2", "charts.py"):
        digest.update((ROOT / "schedlang" / "report" / part).read_bytes())
    return digest.hexdigest()[:16]


def make_database(db: Path, trials: int = 6) -> None:
    """A real tuning run: tune-model of a one-layer MLP, then build-model --compare."""
    from typer.testing import CliRunner

    from schedlang.cli import app

    for args in (
        ["tune-model", *MLP, "--trials", str(trials), "--db", str(db), "--seed", "1"],
        ["build-model", *MLP, "--db", str(db), "--compare", "--repeat", "2"],
    ):
        result = CliRunner().invoke(app, args)
        if result.exit_code != 0:
            raise SystemExit(f"schedlang {' '.join(args)} failed:\n{result.output}")


def main(argv: list[str] | None = None) -> None:
    import argparse
    import os

    from PIL import Image, PngImagePlugin

    from schedlang.report.page import write_report
    from schedlang.testing.browser import open_page

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None, help="an existing database (default: a tiny run)")
    parser.add_argument("--out", default=str(PICTURE))
    parser.add_argument("--height", type=int, default=1250, help="the top kept, in pixels")
    args = parser.parse_args(argv)
    picture = Path(args.out).resolve()
    given = Path(args.db).resolve() if args.db else None
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as folder:
        db, page, shot = (
            Path(folder) / "tune.db",
            Path(folder) / "report.html",
            Path(folder) / "s.png",
        )
        if given is None:
            make_database(db)
        write_report(given or db, page)
        open_page(page, screenshot=shot, width=1000)
        with Image.open(shot) as image:  # the top: the model's charts and the first op's curve
            stamp = PngImagePlugin.PngInfo()
            stamp.add_text("drawn_by", drawn_by())
            top = image.crop((0, 0, image.width, min(image.height, args.height)))
            top.save(picture, optimize=True, pnginfo=stamp)
    print(f"wrote {picture}", file=sys.stderr)


if __name__ == "__main__":
    main()
