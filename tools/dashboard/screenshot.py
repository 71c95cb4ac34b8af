"""Make the README's screenshots of the dashboard.

Run ``python tools/dashboard/screenshot.py`` from the repository root (needs
``pip install -e '.[test]'`` and the system's ``chromium``). It runs the demo's
evaluation and training runs (``primeruns demo``'s own code, through the SDK)
on a local platform in a temporary directory, opens their pages in Chromium
and saves, in ``--dir`` (default ``tools/dashboard/``): ``training-run.png``
(the training run's interactive curves, the mouse over one), ``runs-search.png``
(the runs list searched and filtered) and ``evaluation-analysis.png`` (the
evaluation's reward histogram, pass@k, token usage and task table); then it
logs the demo's evaluation again with errors in a few episodes and saves
``evaluation-errors.png`` (its errors by category), and logs a second
training run and evaluation to compare with the demo's and saves
``compare-runs.png`` (the four ticked in the runs list and compared: curves
overlaid, the evaluations diffed task by task). Nothing outside the
temporary directory and those files is touched.
"""

from __future__ import annotations

import argparse
import copy
import io
import secrets
import shutil
import sys
import tempfile
import uuid
from contextlib import redirect_stdout
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

import primeruns as pr
from primeruns.commands.console import make_console
from primeruns.commands.demo import Demo, _demo_environment
from primeruns.commands.demo_data import eval_episodes, train_episodes
from primeruns.local import LocalPlatform
from primeruns.metrics import from_episodes

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="where the PNGs are written")
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
                demo.eval_run()
                demo.train_run()
                demo.http.close()
            if not all(c.ok for c in demo.checks):
                print(f"the demo's runs failed: {demo.checks}", file=sys.stderr)
                return 1
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium)
                page = browser.new_page(viewport={"width": args.width, "height": 900})
                # The platform has a key: the dashboard is opened by a one-time login link.
                login = httpx.post(
                    f"{platform.url}/_local/login",
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=30,
                )
                page.goto(login.json()["url"])
                written = _shoot(page, platform.url, args.dir)
                # After the runs list's shot, which shows the demo's runs alone.
                with _demo_environment(platform.url, key), redirect_stdout(io.StringIO()):
                    errored = _errored_run(platform.url, key, work / "runs")
                page.goto(errored)
                page.locator("table.error-categories").wait_for()  # loaded after paint
                written.append(args.dir / "evaluation-errors.png")
                page.locator("section.analysis").screenshot(path=written[-1])
                with _demo_environment(platform.url, key), redirect_stdout(io.StringIO()):
                    _runs_to_compare(platform.url, key, work / "more")
                written.append(_shoot_compare(page, platform.url, args.dir))
                browser.close()
    for path in written:
        print(f"wrote {path}")
    return 0


#: Errors given to some of the demo's episodes: episode index -> (where, type, message).
ERRORS = {
    2: ("trace", "ToolTimeout", "python tool hung past 30 s"),
    9: ("trace", "ToolTimeout", "python tool hung past 30 s"),
    17: ("trace", "ToolTimeout", "python tool hung past 30 s"),
    5: ("trace", "ParseError", "no \\boxed{} answer in the completion"),
    21: ("trace", "ParseError", "no \\boxed{} answer in the completion"),
    26: ("episode", "SandboxError", "the sandbox did not start"),
}


def _errored_run(url: str, key: str, runs: Path) -> str:
    """The demo's evaluation logged again, some episodes with an error; its page."""
    episodes = eval_episodes()
    for index, (where, kind, message) in ERRORS.items():
        episode = episodes[index]
        holder = episode["traces"][0] if where == "trace" else episode
        holder["errors"] = [{"type": kind, "message": message}]
    for episode in episodes:  # a new evaluation's own episodes and traces
        episode["id"] = uuid.uuid4().hex
        for trace in episode["traces"]:
            trace["id"] = uuid.uuid4().hex
    run = pr.init(
        name="gsm8k-with-errors",
        environments=["gsm8k"],
        model="Qwen/Qwen3-8B",
        api_key=key,
        base_url=url,
        runs_dir=runs,
    )
    run.log_episodes(episodes)
    run.finish(timeout=60)
    assert run.url is not None
    return run.url


def _runs_to_compare(url: str, key: str, runs: Path) -> None:
    """A second training run (rewards higher than the demo's) and a second
    evaluation (its first task failed, its second passed) to compare with the demo's."""
    common = {"api_key": key, "base_url": url, "runs_dir": runs, "model": "Qwen/Qwen3-8B"}
    train = pr.init(name="demo-train-b", kind="train", team_id="demo-team", **common)
    for step, episodes in train_episodes().items():
        reward = from_episodes(episodes)["avg_reward"]
        train.log_metrics({"reward": min(1.0, reward + 0.15 * (step + 1))}, step=step)
    train.finish(timeout=60)
    evaluation = pr.init(name="demo-gsm8k-b", environments=["gsm8k"], **common)
    episodes = copy.deepcopy(eval_episodes())
    tasks = sorted({e["task"]["data"]["id"] for e in episodes})
    for episode in episodes:
        episode["id"] = uuid.uuid4().hex  # an episode is stored once per id
        score = {tasks[0]: 0.0, tasks[1]: 1.0}.get(episode["task"]["data"]["id"])
        for trace in episode["traces"]:
            trace["id"] = uuid.uuid4().hex
            for reward in trace["rewards"].values() if score is not None else ():
                reward["score"] = score
    evaluation.log_episodes(episodes)
    evaluation.finish(timeout=60)


def _shoot(page: Page, url: str, where: Path) -> list[Path]:
    """Each page's screenshot in ``where``; the paths written."""
    shots = [where / name for name in ("training-run.png", "runs-search.png")]
    page.goto(f"{url}/?kind=train")
    page.get_by_role("link", name="demo-train", exact=True).click()
    reward = page.locator('figure.curve[data-metric="reward"]')
    reward.locator(".uplot canvas").first.wait_for()
    reward.scroll_into_view_if_needed()
    box = reward.locator(".u-over").bounding_box()
    if box is not None:  # the mouse over a curve: every chart's legend gives its values
        page.mouse.move(box["x"] + box["width"] * 0.66, box["y"] + box["height"] / 2)
    page.screenshot(path=shots[0], full_page=True)
    page.goto(f"{url}/")
    page.get_by_role("searchbox").fill("demo")
    page.get_by_label("model").select_option("Qwen/Qwen3-8B")
    page.get_by_role("button", name="filter").click()
    page.locator("table.runs tr.run").first.wait_for()
    page.screenshot(path=shots[1])
    page.get_by_role("link", name="demo-gsm8k", exact=True).click()
    analysis = page.locator("section.analysis")
    analysis.wait_for()
    shots.append(where / "evaluation-analysis.png")
    analysis.screenshot(path=shots[2])
    return shots


def _shoot_compare(page: Page, url: str, where: Path) -> Path:
    """The demo's runs and the two to compare with them, ticked in the runs list and compared."""
    page.goto(f"{url}/")
    for name in ("demo-train", "demo-train-b", "demo-gsm8k", "demo-gsm8k-b"):
        page.get_by_label(f"select {name}", exact=True).check()
    page.get_by_role("button", name="compare selected").click()
    reward = page.locator('figure.curve[data-metric="reward"]')
    reward.locator(".uplot canvas").first.wait_for()
    shot = where / "compare-runs.png"
    page.screenshot(path=shot, full_page=True)
    return shot


if __name__ == "__main__":
    sys.exit(main())
