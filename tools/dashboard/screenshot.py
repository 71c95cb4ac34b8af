"""Make the README's screenshot of a training run's dashboard page.

Run ``python tools/dashboard/screenshot.py`` from the repository root (needs
``pip install -e '.[test]'`` and the system's ``chromium``). It runs the demo's
training run (``primeruns demo``'s own code, through the SDK) on a local
platform in a temporary directory, opens the run's page in Chromium and saves
``tools/dashboard/training-run.png``. Nothing outside the temporary directory
and that file is touched.
"""

from __future__ import annotations

import argparse
import io
import secrets
import shutil
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

from playwright.sync_api import sync_playwright

from primeruns.commands.console import make_console
from primeruns.commands.demo import Demo, _demo_environment
from primeruns.local import LocalPlatform

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=HERE / "training-run.png")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("needs the system's Chromium: apt-get install chromium", file=sys.stderr)
        return 2
    key = f"demo-{secrets.token_urlsafe(12)}"
    with tempfile.TemporaryDirectory(prefix="dashboard-shot-") as tmp:
        work = Path(tmp)
        with LocalPlatform(work / "platform", api_key=key) as platform:
            with _demo_environment(platform.url, key), redirect_stdout(io.StringIO()):
                demo = Demo(platform.url, key, work, make_console())
                demo.train_run()
                demo.http.close()
            if not all(c.ok for c in demo.checks):
                print(f"the demo's training run failed: {demo.checks}", file=sys.stderr)
                return 1
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium)
                page = browser.new_page(viewport={"width": args.width, "height": 900})
                page.goto(f"{platform.url}/?kind=train")
                page.get_by_role("link", name="demo-train").click()
                page.locator("figure.curve").first.wait_for()
                page.screenshot(path=args.output, full_page=True)
                browser.close()
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
