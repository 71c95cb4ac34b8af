"""The dashboard in a real browser: the system's Chromium, driven by Playwright.

The runs are the demo's own (its evaluation and training run, through the
SDK, on a local platform these fixtures start), and every assertion is about
what a user sees: a point per logged step on each curve and its value under
the mouse, zoom, pan, smoothing, log and time axes, runs compared (curves
overlaid, evaluations diffed task by task), a row per sample, the episode's
messages, markup in user content shown as text, a live page that moves on by
itself. Where a chart's geometry decides where the mouse goes, it is read
from the chart (uPlot's ``valToPos``); what is asserted is what the page
shows. The expected figures come from the platform's API, never from
constants. Screenshots of each page are saved under pytest's tmp path
(``dashboard-screenshots*``).

Without Chromium these tests are skipped, saying why; with ``$CI`` set they
fail instead (``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import (
    ERRORS,
    HOSTILE,
    errored_episodes,
    fresh,
    hostile_episode,
    local_runs,
    serve_runs_dir,
    stored_metrics,
    stored_samples,
    stored_steps,
)
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

import primeruns as pr
from primeruns.commands.console import make_console
from primeruns.commands.demo import Demo, _demo_environment
from primeruns.commands.demo_data import eval_episodes
from primeruns.local import LocalPlatform
from primeruns.projection import trace_to_sample

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Playwright comes with the test extra; the browser is the machine's (Debian's
# chromium: Playwright's own download cannot work here). Without it, a
# developer's run skips these tests, saying why; CI installs it and sets CI,
# where its absence fails.
if CHROMIUM is None:
    if os.environ.get("CI"):
        pytest.fail("CI is set but there is no Chromium on PATH", pytrace=False)
    pytest.skip("no Chromium on PATH: apt-get install chromium", allow_module_level=True)

# Live pages poll every 2 s and the SDK ships in the background: allow for both.
expect.set_options(timeout=20_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for all these tests (a launch costs about a second).

    Module, not session, scope: Playwright's sync API runs an asyncio loop on
    this thread while it is up, and a later test's ``asyncio.run()`` would
    find it running."""
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-screenshots")


@dataclass
class DemoRuns:
    url: str
    key: str
    runs_dir: Path
    ids: dict[str, str]  # run id by name

    def new_run(self, **kwargs: Any) -> pr.Run:
        return pr.init(api_key=self.key, base_url=self.url, runs_dir=self.runs_dir, **kwargs)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRuns]:
    """The demo's evaluation and training run, on a platform of this module."""
    work = tmp_path_factory.mktemp("demo")
    key = f"demo-{secrets.token_urlsafe(12)}"
    with (
        pytest.MonkeyPatch.context() as mp,
        LocalPlatform(work / "platform", api_key=key) as platform,
        _demo_environment(platform.url, key),
    ):
        mp.setenv("HOME", str(work))
        runner = Demo(platform.url, key, work, make_console())
        try:
            runner.eval_run()
            runner.train_run()
        finally:
            runner.http.close()
        assert runner.checks and all(c.ok for c in runner.checks), runner.checks
        ids = {name: run["id"] for name, run in local_runs(platform.url, key).items()}
        yield DemoRuns(platform.url, key, runner.runs, ids)


def _bearer(demo: DemoRuns) -> dict[str, str]:
    return {"Authorization": f"Bearer {demo.key}"}


@pytest.fixture
def page(browser: Browser, demo: DemoRuns) -> Iterator[Page]:
    """A fresh tab, logged in to the demo's platform by a one-time link as a
    user would be, that fails the test on any dialog (an alert is injected
    markup running) and on any request that leaves the page's origin."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    dialogs: list[str] = []
    foreign: list[str] = []
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    tab.on(
        "request",
        lambda r: (
            foreign.append(r.url) if not r.url.startswith(("http://127.0.0.1:", "data:")) else None
        ),
    )
    link = httpx.post(f"{demo.url}/_local/login", headers=_bearer(demo), timeout=10).json()["url"]
    tab.goto(link)
    yield tab
    context.close()
    assert not dialogs, dialogs
    assert not foreign, f"requests left the machine: {foreign}"


def _open_run(demo: DemoRuns, page: Page, section: str, name: str) -> str:
    """Open the page of the demo's run ``name``; its run id."""
    run_id = demo.ids[name]
    page.goto(f"{demo.url}/dashboard/{section}/{run_id}")
    return run_id


def _metric_names(rows: list[dict[str, Any]]) -> set[str]:
    return {
        k
        for row in rows
        for k, v in row.items()
        if k != "step" and not k.startswith("_") and isinstance(v, int | float)
    }


def _wait_drawn(page: Page, metric: str, points: int, series: int = 1) -> Locator:
    """The chart of ``metric`` once uPlot has drawn it with ``points`` x values
    and ``series`` lines (a live page's swap redraws it)."""
    figure = page.locator(f"figure.curve[data-metric={json.dumps(metric)}]")
    expect(figure.locator(".uplot canvas")).to_be_visible()
    page.wait_for_function(
        "([m, n, k]) => { const f = [...document.querySelectorAll('figure.curve')]"
        ".find(e => e.dataset.metric === m); const c = f && f.__chart;"
        " return !!c && c.data[0].length === n && c.series.length === k + 1; }",
        arg=[metric, points, series],
    )
    return figure


def _hover(page: Page, figure: Locator, x: float) -> None:
    """The mouse over ``figure``'s chart at ``x`` (in the x axis' units), half way up."""
    figure.scroll_into_view_if_needed()
    box = figure.locator(".u-over").bounding_box()
    assert box is not None
    left = figure.evaluate("(f, x) => f.__chart.valToPos(x, 'x')", x)
    # Within the plot: its first and last pixel columns are its edges.
    left = min(max(left, 1), box["width"] - 1)
    page.mouse.move(box["x"] + left, box["y"] + box["height"] / 2)


def _legend(figure: Locator, series: int) -> str:
    """What the legend shows for ``series`` (0: the x axis, 1: the first line)."""
    return figure.locator(".u-legend .u-series").nth(series).locator(".u-value").inner_text()


def _x_range(figure: Locator) -> tuple[float, float]:
    low, high = figure.evaluate("f => [f.__chart.scales.x.min, f.__chart.scales.x.max]")
    return low, high


def _ema(values: list[float], weight: float) -> list[float]:
    """The debiased exponential moving average the smoothing slider applies."""
    out, last = [], 0.0
    for n, value in enumerate(values, start=1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight**n))
    return out


def test_runs_list_shows_every_run_and_links_to_its_page(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    known = local_runs(demo.url, demo.key)  # the demo's runs, and any an earlier test added
    page.goto(f"{demo.url}/")
    rows = page.locator("table.runs tr.run")
    expect(rows).to_have_count(len(known))
    train_row = page.locator(f'tr.run[data-run-id="{demo.ids["demo-train"]}"]')
    expect(train_row).to_contain_text("COMPLETED")
    expect(train_row).to_contain_text("Qwen/Qwen3-8B")
    page.screenshot(path=shots / "runs.png", full_page=True)
    train_row.get_by_role("link", name="demo-train").click()
    expect(page).to_have_url(f"{demo.url}/dashboard/training/{demo.ids['demo-train']}")
    page.goto(f"{demo.url}/?kind=eval")
    expect(rows).to_have_count(sum(1 for r in known.values() if r["kind"] == "eval"))


def test_training_page_draws_a_point_per_logged_step_and_opens_a_step_table(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    run_id = _open_run(demo, page, "training", "demo-train")
    steps = stored_steps(demo.url, demo.key, run_id)
    names = _metric_names(stored_metrics(demo.url, demo.key, run_id))
    assert names and steps
    expect(page.locator("figure.curve")).to_have_count(len(names))
    for name in names:
        _wait_drawn(page, name, len(steps))
    expect(page.locator(".latest-step")).to_have_text(str(max(steps)))
    page.screenshot(path=shots / "training.png", full_page=True)

    stored = httpx.get(f"{demo.url}/_local/runs/{run_id}", headers=_bearer(demo), timeout=10)
    objects = stored.json()["parquet_objects"]
    assert objects
    first = objects[0]
    page.locator("table.steps").get_by_role("link", name=str(first["step"]), exact=True).click()
    rows = page.locator("tr.step-row")
    expect(rows).to_have_count(first["rows"])
    rows.first.locator("summary").click()
    expect(rows.first.locator("li.message").first).to_be_visible()
    page.screenshot(path=shots / "training-step.png", full_page=True)


def test_evaluation_page_lists_its_samples_and_each_opens_its_episode(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    run_id = _open_run(demo, page, "evaluations", "demo-gsm8k")
    samples = stored_samples(demo.url, demo.key, run_id)
    rows = page.locator("table.samples tr.sample")
    expect(rows).to_have_count(min(50, len(samples)))
    expect(page.locator("table.facts")).to_contain_text("COMPLETED")
    expect(page.locator("table.summary")).to_contain_text("avg_reward")
    wrong = next(i for i, s in enumerate(samples) if not s["reward"])
    expect(rows.nth(wrong).locator("td.correct")).to_have_text("no")
    page.screenshot(path=shots / "evaluation.png", full_page=True)

    rows.first.get_by_role("link").click()
    expect(page).to_have_url(re.compile(r"/samples/0$"))
    trace = samples[0]["info"]["native_wrapper"]["traces"][0]
    messages = trace_to_sample(trace)["completion"]
    shown = page.locator("article.trace li.message")
    expect(shown).to_have_count(len(messages))
    answer = messages[-1]["content"]
    expect(shown.last.locator("pre")).to_have_text(answer)
    expect(page.locator("pre.completion")).to_have_text(answer)
    expect(page.locator("td.reward")).to_have_text(f"{samples[0]['reward']:.4g}")
    page.screenshot(path=shots / "episode.png", full_page=True)


def test_markup_in_user_content_shows_as_text_and_never_runs(demo: DemoRuns, page: Page) -> None:
    run = demo.new_run(name=HOSTILE, environments=["gsm8k"], model="m")
    run.log_episodes([hostile_episode()])
    run.finish(status="failed", error=HOSTILE, timeout=60)
    assert run.url is not None
    page.goto(f"{run.url}/samples/0")
    expect(page.locator("pre.completion")).to_have_text(f"assistant says {HOSTILE}")
    page.goto(f"{demo.url}/")
    expect(page.locator(f'tr.run[data-run-id="{run.id}"] .error')).to_have_text(HOSTILE)
    page.goto(run.url)
    expect(page.locator("h1")).to_have_text(HOSTILE)
    expect(page.locator("section.analysis .analysed")).to_be_visible()  # loaded after paint
    assert page.evaluate("window.__pwned") is None
    train = demo.new_run(name="hostile-metric", kind="train", model="m", team_id="demo-team")
    train.log_metrics({HOSTILE: 1.0}, step=0)
    train.finish(timeout=60)
    assert train.url is not None
    page.goto(train.url)
    expect(page.locator("figure.curve .metric")).to_have_text(HOSTILE)
    _wait_drawn(page, HOSTILE, 1)
    # The chart's title and legend show the name as text (uPlot, fed by curves.js).
    expect(page.locator("figure.curve .u-title")).to_have_text(HOSTILE)
    expect(page.locator("figure.curve .u-legend .u-series").nth(1)).to_contain_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None
    page.goto(f"{demo.url}/dashboard/compare?run={train.id}&run={run.id}")
    expect(page.locator("tr.eval-summary a")).to_have_text(HOSTILE)
    expect(page.locator("figure.curve .u-legend .u-series").nth(1)).to_contain_text(
        "hostile-metric"
    )
    assert page.evaluate("window.__pwned") is None


def test_a_live_training_page_moves_on_without_a_reload(demo: DemoRuns, page: Page) -> None:
    run = demo.new_run(name="live-train", kind="train", model="m", team_id="demo-team")
    run.log_metrics({"loss": 1.0}, step=0)
    assert run.flush(timeout=30) and run.url is not None
    page.goto(run.url)
    _wait_drawn(page, "loss", 1)
    expect(page.locator(".live")).to_be_visible()
    page.evaluate("window.__same_document = true")  # gone if the page were reloaded
    page.get_by_label("smoothing").fill("0.5")  # kept when news are swapped in
    run.log_metrics({"loss": 0.5}, step=1)
    run.log_metrics({"loss": 0.25}, step=2)
    _wait_drawn(page, "loss", 3)
    expect(page.get_by_label("smoothing")).to_have_value("0.5")
    run.finish(timeout=60)
    expect(page.locator("table.facts .status")).to_have_text("COMPLETED")
    expect(page.locator(".live")).to_have_count(0)
    assert page.evaluate("window.__same_document") is True


def test_a_live_evaluations_analysis_moves_on_without_a_reload(demo: DemoRuns, page: Page) -> None:
    """The analysis is loaded after the page (fragments.js, under the page's CSP
    and login) and again whenever a live page swaps in news: asked with the
    version it shows, it comes back as a 204 while no sample was added (the
    run finished), and the part shown stays."""
    episodes = [fresh(e) for e in eval_episodes()]
    run = demo.new_run(name="live-eval", environments=["gsm8k"], model="m")
    run.log_episodes(episodes[:2])
    assert run.flush(timeout=30) and run.url is not None
    page.goto(run.url)
    analysed = page.locator("section.analysis .analysed")
    expect(analysed).to_contain_text("2 samples")
    expect(page.locator("section.analysis-slot")).to_have_count(0)  # the placeholder is gone
    page.evaluate("window.__same_document = true")  # gone if the page were reloaded
    run.log_episodes(episodes[2:5])
    expect(page.locator("table.samples tr.sample")).to_have_count(5)
    expect(analysed).to_contain_text("5 samples")
    with page.expect_response(lambda r: r.url.endswith("/analysis")) as asked:
        run.finish(timeout=60)
        expect(page.locator(".live")).to_have_count(0)
    assert asked.value.status == 204  # nothing rendered: its samples are the same
    expect(analysed).to_contain_text("5 samples")
    expect(page.locator("section.analysis-slot")).to_have_count(0)
    assert page.evaluate("window.__same_document") is True


def test_offline_journals_show_the_same_curves(demo: DemoRuns, page: Page, shots: Path) -> None:
    """``serve --runs-dir`` over the demo's journals: the training run's curves
    have as many dots as the platform stored steps."""
    steps = stored_steps(demo.url, demo.key, demo.ids["demo-train"])
    _, url = serve_runs_dir(demo.runs_dir)
    page.goto(f"{url}/?kind=train")
    page.get_by_role("link", name="demo-train").click()
    _wait_drawn(page, "reward", len(steps))
    page.screenshot(path=shots / "offline-training.png", full_page=True)


def test_the_runs_list_finds_runs_by_search_and_filters(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    run = demo.new_run(
        name="find-me", environments=["gsm8k"], model="finder-model", tags=["sweep-7", "nightly"]
    )
    run.finish(timeout=60)
    page.goto(f"{demo.url}/")
    row = page.locator(f'tr.run[data-run-id="{run.id}"]')
    expect(row.locator("td.environments")).to_have_text("gsm8k")
    expect(row.locator("td.tags .tag")).to_have_text(["sweep-7", "nightly"])
    rows = page.locator("table.runs tr.run")
    page.get_by_role("searchbox").fill("FIND-ME")
    page.get_by_role("searchbox").press("Enter")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run-id", run.id)
    page.screenshot(path=shots / "runs-search.png", full_page=True)

    page.goto(f"{demo.url}/")
    page.get_by_label("tag").select_option("nightly")
    page.get_by_role("button", name="filter").click()
    expect(page).to_have_url(re.compile(r"tag=nightly"))
    expect(rows).to_have_count(1)
    page.get_by_label("model").select_option("Qwen/Qwen3-8B")
    page.get_by_role("button", name="filter").click()
    expect(page.locator("table.runs td.none")).to_have_text("no runs match these filters")
    page.get_by_role("link", name="clear").click()
    expect(rows).to_have_count(len(local_runs(demo.url, demo.key)))
    page.get_by_label("environment").select_option("gsm8k")
    page.get_by_label("kind").select_option("eval")
    page.get_by_role("button", name="filter").click()
    expect(page.locator(f'tr.run[data-run-id="{demo.ids["demo-gsm8k"]}"]')).to_have_count(1)
    expect(page.locator(f'tr.run[data-run-id="{demo.ids["demo-train"]}"]')).to_have_count(0)

    _, url = serve_runs_dir(demo.runs_dir)  # the same over the journals
    page.goto(f"{url}/")
    page.get_by_role("searchbox").fill("demo-train")
    page.get_by_role("searchbox").press("Enter")
    expect(page.locator("table.runs tr.run")).to_have_count(1)
    expect(page.locator("table.runs tr.run a")).to_have_text("demo-train")


def test_an_evaluation_is_analysed_and_its_samples_filtered_and_walked(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    run_id = _open_run(demo, page, "evaluations", "demo-gsm8k")
    samples = stored_samples(demo.url, demo.key, run_id)
    per_task: dict[str, int] = {}
    for s in samples:
        per_task[s["task"]["id"]] = per_task.get(s["task"]["id"], 0) + 1
    expect(page.locator("table.histogram tr.bin").first).to_be_visible()
    expect(page.locator("tr.pass-at")).to_have_count(max(per_task.values()))
    expect(page.locator("table.tasks tr.task")).to_have_count(len(per_task))
    page.screenshot(path=shots / "evaluation-analysis.png", full_page=True)

    # The task filter offers the analysis' tasks (loaded after the page).
    task = samples[0]["task"]["id"]
    filters = page.locator("form.sample-filters")
    filters.get_by_label("task").fill(task)
    filters.get_by_role("button", name="filter").click()
    expect(page.locator("table.samples tr.sample td.task")).to_have_text([task] * per_task[task])
    page.goto(f"{demo.url}/dashboard/evaluations/{run_id}")

    wrong = [i for i, s in enumerate(samples) if not s["reward"]]
    page.locator("form.sample-filters").get_by_label("correct").select_option("no")
    page.locator("form.sample-filters").get_by_role("button", name="filter").click()
    rows = page.locator("table.samples tr.sample")
    expect(rows).to_have_count(len(wrong))
    expect(rows.locator("td.correct")).to_have_text(["no"] * len(wrong))
    page.locator("table.samples").get_by_role("link", name="reward").click()
    expect(page).to_have_url(re.compile(r"sort=reward"))

    page.goto(f"{demo.url}/dashboard/evaluations/{run_id}?correct=no")
    rows.first.get_by_role("link").click()
    expect(page).to_have_url(re.compile(rf"/samples/{wrong[0]}\?correct=no$"))
    expect(page.locator("pre.answer")).to_have_text(str(samples[wrong[0]]["answer"]))
    page.screenshot(path=shots / "episode-ground-truth.png", full_page=True)
    page.get_by_role("link", name=re.compile("^next")).click()
    expect(page).to_have_url(re.compile(rf"/samples/{wrong[1]}\?correct=no$"))
    page.get_by_role("link", name=re.compile("^previous")).click()
    expect(page).to_have_url(re.compile(rf"/samples/{wrong[0]}\?correct=no$"))


def test_an_evaluations_token_usage_and_error_categories_filter_its_samples(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    """Token usage (totals, a sortable column) on the demo's evaluation; errors
    by category, whose links and filter narrow the samples, on a run with
    errors, online and from its journal (``serve --runs-dir``)."""
    run_id = _open_run(demo, page, "evaluations", "demo-gsm8k")
    episodes = [s["info"]["native_wrapper"] for s in stored_samples(demo.url, demo.key, run_id)]
    read = sum(e["num_input_tokens"] for e in episodes)
    written = sorted((e["num_output_tokens"] for e in episodes), reverse=True)
    expect(page.locator("tr.tokens-input td.total")).to_have_text(str(read))
    expect(page.locator("tr.tokens-output td.total")).to_have_text(str(sum(written)))
    expect(page.locator("section.analysis")).to_contain_text("no sample has an error")
    page.locator("tr.tokens-most").get_by_role("link", name="the longest first").click()
    expect(page).to_have_url(re.compile(r"sort=output_tokens&order=desc"))
    rows = page.locator("table.samples tr.sample")
    expect(rows.locator("td.output-tokens")).to_have_text([str(n) for n in written])
    page.locator("table.samples").get_by_role("link", name="tokens out").click()  # reversed
    expect(rows.first.locator("td.output-tokens")).to_have_text(str(written[-1]))
    page.screenshot(path=shots / "evaluation-tokens.png", full_page=True)

    run = demo.new_run(name="errors-eval", environments=["gsm8k"], model="m")
    run.log_episodes(errored_episodes())
    run.finish(timeout=60)
    assert run.url is not None and run.journal_path is not None
    _, offline = serve_runs_dir(demo.runs_dir)
    timeouts = [i for i, (_, kind, _) in ERRORS.items() if kind == "ToolTimeout"]
    for url in (run.url, f"{offline}/dashboard/evaluations/{run.journal_path.name}"):
        page.goto(url)
        categories = page.locator("table.error-categories tr.error-category")
        expect(categories.locator("td.category-count")).to_have_text(["2", "1", "1"])
        page.screenshot(path=shots / "evaluation-errors.png", full_page=True)
        categories.get_by_role("link", name="ToolTimeout").click()
        expect(page).to_have_url(re.compile(r"category=ToolTimeout"))
        expect(rows.locator("td:first-child")).to_have_text([str(i) for i in timeouts])
        expect(rows.locator("td.error")).to_have_text([re.compile("^ToolTimeout: ")] * 2)
        page.goto(url)
        filters = page.locator("form.sample-filters")
        filters.get_by_label("error category").fill("SandboxError")
        filters.get_by_role("button", name="filter").click()
        expect(rows.locator("td.error")).to_have_text(["SandboxError: the sandbox did not start"])
        rows.first.get_by_role("link").click()
        expect(page.locator("td.error")).to_have_text("SandboxError: the sandbox did not start")


def _metric_column(rows: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    points = sorted((int(r["step"]), float(r[name])) for r in rows if name in r)
    return [p[0] for p in points], [p[1] for p in points]


def test_curves_show_values_on_hover_zoom_pan_smooth_and_take_a_log_or_time_axis(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    run_id = _open_run(demo, page, "training", "demo-train")
    rows = stored_metrics(demo.url, demo.key, run_id)
    steps, rewards = _metric_column(rows, "reward")
    reward = _wait_drawn(page, "reward", len(steps))

    # Hover: the legend gives the value stored at the step under the mouse.
    for step, value in zip(steps, rewards, strict=True):
        _hover(page, reward, step)
        assert float(_legend(reward, 1)) == pytest.approx(value, rel=1e-5)
        assert float(_legend(reward, 0)) == step
    page.screenshot(path=shots / "training-hover.png", full_page=True)

    # Zoom: drag across steps 1 to 2; a double-click shows every step again.
    reward.scroll_into_view_if_needed()
    box = reward.locator(".u-over").bounding_box()
    assert box is not None
    at = [box["x"] + reward.evaluate("(f, x) => f.__chart.valToPos(x, 'x')", x) for x in (1, 2)]
    y = box["y"] + box["height"] / 2
    page.mouse.move(at[0], y)
    page.mouse.down()
    page.mouse.move(at[1], y, steps=5)
    page.mouse.up()
    low, high = _x_range(reward)
    assert low == pytest.approx(1, abs=0.05) and high == pytest.approx(2, abs=0.05)
    # Pan: shift-drag to the right shows earlier steps, the width unchanged.
    moved = 60
    page.keyboard.down("Shift")
    page.mouse.move(at[0], y)
    page.mouse.down()
    page.mouse.move(at[0] + moved, y, steps=5)
    page.mouse.up()
    page.keyboard.up("Shift")
    panned = _x_range(reward)
    shift = moved / box["width"] * (high - low)
    assert panned[0] == pytest.approx(low - shift, abs=0.02)
    assert panned[1] - panned[0] == pytest.approx(high - low)
    page.mouse.dblclick(at[0], y)
    assert _x_range(reward) == pytest.approx((min(steps), max(steps)))

    # Smoothing: the legend gives the moving average of the stored values.
    page.get_by_label("smoothing").fill("0.9")
    expect(page.locator(".smooth-value")).to_have_text("0.90")
    reward = _wait_drawn(page, "reward", len(steps))
    smoothed = _ema(rewards, 0.9)
    for step, value in zip(steps, smoothed, strict=True):
        _hover(page, reward, step)
        assert float(_legend(reward, 1)) == pytest.approx(value, rel=1e-5)
    page.get_by_label("smoothing").fill("0")

    # Log scale: a logarithmic y axis; values it cannot show are said, not drawn.
    page.get_by_label("log scale").check()
    for name in _metric_names(rows):
        values = _metric_column(rows, name)[1]
        hidden = sum(1 for v in values if v <= 0)
        figure = page.locator(f"figure.curve[data-metric={json.dumps(name)}]")
        if hidden < len(values):
            _wait_drawn(page, name, len(values))
            assert figure.evaluate("f => f.__chart.scales.y.distr") == 3
        note = figure.locator(".chart-note")
        if hidden:
            expect(note).to_have_text(f"{hidden} values at or below 0 (not on a log axis)")
        else:
            expect(note).to_be_hidden()
    page.get_by_label("log scale").uncheck()

    # Time axes: relative time counts seconds from the run's first row.
    stamps = sorted(float(r["_timestamp"]) for r in rows)
    page.get_by_label("x axis").select_option("relative")
    reward = _wait_drawn(page, "reward", len(steps))
    _hover(page, reward, stamps[-1] - stamps[0])
    assert float(_legend(reward, 0)) == pytest.approx(stamps[-1] - stamps[0], abs=1e-3)
    assert float(_legend(reward, 1)) == pytest.approx(rewards[-1], rel=1e-5)
    page.get_by_label("x axis").select_option("time")
    reward = _wait_drawn(page, "reward", len(steps))
    assert reward.evaluate("f => f.__chart.scales.x.time") is True
    _hover(page, reward, stamps[-1])
    assert float(_legend(reward, 1)) == pytest.approx(rewards[-1], rel=1e-5)


def _second_training_run(demo: DemoRuns, name: str, values: dict[int, float]) -> pr.Run:
    run = demo.new_run(name=name, kind="train", model="m", team_id="demo-team")
    for step, value in values.items():
        run.log_metrics({"reward": value}, step=step)
    run.finish(timeout=60)
    return run


def _flipped_evaluation(demo: DemoRuns, name: str, scores: dict[str, float]) -> pr.Run:
    """The demo's evaluation again, the rewards of the tasks in ``scores`` replaced."""
    run = demo.new_run(name=name, environments=["gsm8k"], model="m")
    episodes = [fresh(e) for e in eval_episodes()]
    for episode in episodes:
        score = scores.get(episode["task"]["data"]["id"])
        for trace in episode["traces"] if score is not None else []:
            for reward in trace["rewards"].values():
                reward["score"] = score
    run.log_episodes(episodes)
    run.finish(timeout=60)
    return run


def _shares(samples: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Per task: correct samples (reward above 0) and scored samples."""
    out: dict[str, tuple[int, int]] = {}
    for s in samples:
        correct, scored = out.get(s["task"]["id"], (0, 0))
        out[s["task"]["id"]] = (correct + (s["reward"] > 0), scored + 1)
    return out


def _check_compare_page(page: Page, curves: dict[str, int], flips: dict[str, str]) -> None:
    """The compare page as the runs list opened it: ``curves`` lines per metric,
    and the task diff's flipped tasks (by task: fixed or broken) first."""
    for metric, lines in curves.items():
        figure = page.locator(f"figure.curve[data-metric={json.dumps(metric)}]")
        expect(figure.locator(".u-legend .u-series")).to_have_count(lines + 1)
    expect(page.locator(".flipped-count")).to_have_text(str(len(flips)))
    rows = page.locator("table.task-diff tr.task-row")
    for i in range(len(flips)):
        task = rows.nth(i).get_attribute("data-task")
        assert task in flips
        expect(rows.nth(i).locator("td.change")).to_have_text(flips[task])
    expect(rows.nth(len(flips)).locator("td.change")).not_to_have_text(re.compile("fixed|broken"))


def test_runs_ticked_in_the_list_compare_curves_overlaid_and_evaluations_task_by_task(
    demo: DemoRuns, page: Page, shots: Path
) -> None:
    base = demo.ids["demo-train"]
    steps, rewards = _metric_column(stored_metrics(demo.url, demo.key, base), "reward")
    higher = {s: r + 0.25 for s, r in zip(steps, rewards, strict=True)}
    other = _second_training_run(demo, "train-b", higher)
    samples = stored_samples(demo.url, demo.key, demo.ids["demo-gsm8k"])
    before = _shares(samples)
    tasks = sorted(before)
    # Task 0 all wrong, task 1 all right: each a flip unless it already was so.
    flipped = _flipped_evaluation(demo, "gsm8k-b", {tasks[0]: 0.0, tasks[1]: 1.0})
    after = _shares(stored_samples(demo.url, demo.key, flipped.id))
    flips = {
        t: "fixed" if after[t][0] / after[t][1] > before[t][0] / before[t][1] else "broken"
        for t in tasks
        if after[t][0] * before[t][1] != before[t][0] * after[t][1]
    }
    assert flips  # the demo's data has both kinds of task

    page.goto(f"{demo.url}/")
    for name in ("demo-train", "train-b", "demo-gsm8k", "gsm8k-b"):
        page.get_by_label(f"select {name}", exact=True).check()
    page.get_by_role("button", name="compare selected").click()
    expect(page).to_have_url(re.compile(r"/dashboard/compare\?run="))
    reward = _wait_drawn(page, "reward", len(steps), series=2)
    _check_compare_page(page, {"reward": 2}, flips)
    page.screenshot(path=shots / "compare.png", full_page=True)

    # Hover: each run's value at the step; a legend entry hides its run's line.
    _hover(page, reward, steps[-1])
    assert float(_legend(reward, 1)) == pytest.approx(rewards[-1], rel=1e-5)
    assert float(_legend(reward, 2)) == pytest.approx(rewards[-1] + 0.25, rel=1e-5)
    entry = reward.locator(".u-legend .u-series").nth(2)
    expect(entry).to_contain_text("train-b")
    entry.click()
    expect(entry).to_have_class(re.compile("u-off"))
    assert reward.evaluate("f => f.__chart.series[2].show") is False
    entry.click()
    expect(entry).not_to_have_class(re.compile("u-off"))
    swatches = page.locator(".compared-run .swatch")
    colours = swatches.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    assert len(set(colours)) == 2  # a colour per run
    assert other.url is not None

    # The same over the journals (serve --runs-dir).
    _, url = serve_runs_dir(demo.runs_dir)
    page.goto(f"{url}/")
    for name in ("demo-train", "train-b", "demo-gsm8k", "gsm8k-b"):
        page.get_by_label(f"select {name}", exact=True).check()
    page.get_by_role("button", name="compare selected").click()
    _wait_drawn(page, "reward", len(steps), series=2)
    _check_compare_page(page, {"reward": 2}, flips)
