"""The dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium):
the page loads a study from a real nats-server with every view drawn, a running study's new trial appears
within seconds of its events landing on the bus, and each view is photographed.

Screenshots go to the test's temporary directory; with ``INFRARSI_DOCS_SCREENSHOTS=1`` they also replace
``docs/img/dashboard-<view>.png`` (the pictures docs/dashboard.md shows). Chromium is installed with apt-get
when missing and the tests run as root (``make browser-deps`` does the same); otherwise they skip and say why.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer
from support.dashboard import browser_install_reason, running_dashboard
from support.synthetic_study import GIB, synthetic_study, write_workload

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(900)]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
VIEWS = ("studies", "summary", "search", "importance", "slices", "pairs", "trials", "cost", "doctor", "verify", "invariants", "agent")


@pytest.fixture(scope="module")
def browser():
    reason = browser_install_reason()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1500,1000",
                 "--no-proxy-server"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


def _agent_exchange() -> list[tuple[object, str | None]]:
    asked = ev.AgentAsked(
        ask_id="ask1", purpose="proposals", model="qwen2.5-0.5b-instruct", endpoint="http://127.0.0.1:8000/v1",
        messages=[ev.AgentMessage(role="system", content="You tune PyTorch training jobs."),
                  ev.AgentMessage(role="user", content="Propose up to 3 candidates for the tiny GPT: micro_batch_size in "
                                  "{2,4,8,16}, compile on/off, patch fused-qkv. Answer in JSON.")],
        max_tokens=512)
    answered = ev.AgentAnswered(
        ask_id="ask1", ok=True, prompt_tokens=212, completion_tokens=64, cost_usd=0.0004, latency_s=1.7,
        text='{"candidates": [{"knobs": {"micro_batch_size": 8}, "patches": ["fused-qkv"]}, {"knobs": {"micro_batch_size": 3}}]}',
        candidates=[ev.AgentKnobProposal(candidate=ev.Candidate(knobs={"micro_batch_size": 8}, patches=["fused-qkv"]),
                                         reason="larger GEMMs")],
        refused=[ev.AgentRefusal(kind="outside_space", item="candidate 2", detail="micro_batch_size=3 not in choices")])
    return [(asked, None), (answered, None)]


def _wait(driver, condition, timeout_s: float = 60.0):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a live update re-renders the table between a condition's find and its read: the element it found is then
    # stale, and the condition is asked again (a CI run failed on it once)
    return WebDriverWait(driver, timeout_s, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition)


async def test_the_dashboard_in_chromium_shows_every_view_and_a_new_trial_live(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    data = tmp_path / "data"
    study = ev.new_id()
    with EmbeddedServer.start(data, authorize=True) as server:
        bus = await Bus.connect(server.url, service="admin", data_dir=data)
        try:
            log = synthetic_study(study, write_workload(tmp_path / "workload"), seed=4, before_search=_agent_exchange())
            await bus.publish_many(log)
            expected_trials = len({e.trial_id for e in log if e.type == "TrialProposed"})
            with running_dashboard("--nats-url", server.url, "dashboard", "--port", "0", "--poll", "10",
                                   data_dir=data) as page:
                browser.get(page)
                rows = "#trials-table tbody tr"
                _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == expected_trials)
                _wait(browser, lambda d: d.find_element(By.ID, "live").text == "live")
                # Every plot drawn by plotly.js (served by the dashboard: the browser reaches nothing else).
                for plot in ("plot-best", "plot-memory", "plot-space", "plot-importance", "plot-slices", "plot-pairs",
                             "plot-cost", "plot-doctor", "plot-verify"):
                    _wait(browser, lambda d, p=plot: d.find_elements(By.CSS_SELECTOR, f"#{p} .main-svg"))
                memory = browser.find_element(By.ID, "plot-memory").text
                assert "capacity" in memory and "OOM" in memory
                stage = browser.find_element(By.CSS_SELECTOR, f'#studies-table tr[data-study="{study}"] .stage').text
                assert stage == "verify"
                assert "outside_space: candidate 2" in browser.find_element(By.ID, "agent-list").text
                assert "search7" in browser.find_element(By.ID, "invariants-table").text
                assert "patch fused-qkv" in browser.find_element(By.ID, "plot-space").text
                # optuna-dashboard's importance, slice and contour views, with the OOM trial kept in each.
                importance = browser.find_element(By.ID, "plot-importance").text
                assert "unexplained" in importance and "micro_batch_size" in importance and "OOM (9 trials)" in importance
                assert "1 of 9 that ran went out of memory" in browser.find_element(By.ID, "importance-note").text
                slices = browser.find_element(By.ID, "plot-slices").text
                assert "out of memory" in slices and "patch fused-qkv" in slices and "compile" in slices
                assert browser.execute_script(  # the OOM trial (micro-batch 16) drawn in the micro-batch slice
                    "return document.getElementById('plot-slices').data.filter((t) => t.name === 'out of memory'"
                    " && t.xaxis === 'x2')[0].x") == ["16"]  # "golden" beside it: categorical
                pairs = browser.find_element(By.ID, "plot-pairs").text
                assert "out of memory" in pairs
                # by default the two most important for the step time (the patch, then the micro-batch, on this log)
                assert browser.find_element(By.ID, "pair-x").get_attribute("value") == "patch fused-qkv"
                assert browser.find_element(By.ID, "pair-y").get_attribute("value") == "micro_batch_size"
                Select(browser.find_element(By.ID, "pair-x")).select_by_value("compile")
                _wait(browser, lambda d: "compile × micro_batch_size" in d.find_element(By.ID, "plot-pairs").text,
                      timeout_s=10)
                Select(browser.find_element(By.ID, "pair-x")).select_by_value("patch fused-qkv")

                # The trials table filters in the page (optuna-dashboard's table does).
                not_ok = {"oom", "crash", "timeout", "scope_violation", "invariant_violation"}
                failed = [e.trial_id for e in log if e.type == "TrialFinished" and e.payload.status != "ok"]
                Select(browser.find_element(By.ID, "filter-outcome")).select_by_value("failed")
                # search7 ran ok but broke the loss invariant: not ok either.
                _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == len(failed) + 1, timeout_s=10)
                shown = browser.find_elements(By.CSS_SELECTOR, rows)
                assert all(r.find_element(By.CSS_SELECTOR, ".badge").text in not_ok for r in shown)
                Select(browser.find_element(By.ID, "filter-outcome")).select_by_value("")
                _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == expected_trials, timeout_s=10)
                browser.find_element(By.ID, "filter-text").send_keys("fused-qkv")
                with_patch = len({e.trial_id for e in log if e.type == "TrialProposed" and "fused-qkv" in e.payload.candidate.patches})
                _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == with_patch, timeout_s=10)
                assert all("fused-qkv" in r.text for r in browser.find_elements(By.CSS_SELECTOR, rows))
                browser.find_element(By.ID, "filter-text").clear()
                browser.execute_script("document.getElementById('filter-text').dispatchEvent(new Event('input'))")
                _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == expected_trials, timeout_s=10)

                errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
                assert not errors, errors

                shots = tmp_path / "shots"
                shots.mkdir()
                for view in VIEWS:
                    element = browser.find_element(By.ID, f"view-{view}")
                    browser.execute_script("arguments[0].scrollIntoView()", element)
                    element.screenshot(str(shots / f"dashboard-{view}.png"))
                    assert (shots / f"dashboard-{view}.png").stat().st_size > 5_000, view
                if os.environ.get("INFRARSI_DOCS_SCREENSHOTS") == "1":
                    DOCS_IMG.mkdir(parents=True, exist_ok=True)
                    for shot in shots.iterdir():
                        shutil.copyfile(shot, DOCS_IMG / shot.name)

                # The study runs on: a new search trial is proposed and launched, then finishes.
                late = ev.Candidate(knobs={"micro_batch_size": 2}, patches=["fused-qkv"])
                published = time.monotonic()
                await bus.publish_many([
                    ev.make_event(ev.TrialProposed(candidate=late, candidate_key=late.key(), kind="search", origin="ei",
                                                   prediction=ev.Prediction(step_time_s=0.17, step_time_std_log=0.1,
                                                                            peak_memory_bytes=2.9 * GIB, p_oom=0.01)),
                                  study_id=study, source="proposer", trial_id="late1", cluster_id="local"),
                    ev.make_event(ev.TrialLaunched(backend="local", workdir="/tmp/late1", command=["python", "train.py"],
                                                   nodes=1, ranks=2, host="localhost", job_id="4242"),
                                  study_id=study, source="launcher", trial_id="late1", cluster_id="local"),
                ])
                row = '#trials-table tr[data-trial="late1"]'
                _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), timeout_s=15)
                shown_after_s = time.monotonic() - published
                assert "running" in browser.find_element(By.CSS_SELECTOR, row).text
                _wait(browser, lambda d: "1 running" in d.find_element(
                    By.CSS_SELECTOR, f'#studies-table tr[data-study="{study}"] .stage').text, timeout_s=10)
                # Its probe reports steps (telemetry rings no doorbell: shown by the next poll, --poll 10).
                await bus.publish_many([
                    ev.make_event(ev.TrialStep(rank=0, world_size=2, step=step, loss=3.0, step_time_s=0.17, tokens=8192,
                                               optimizer_steps=step, peak_memory_bytes=2 * GIB),
                                  study_id=study, source="probe", trial_id="late1", cluster_id="local")
                    for step in (1, 2, 3)])
                _wait(browser, lambda d: "running step 3" in d.find_element(By.CSS_SELECTOR, row).text, timeout_s=25)

                await bus.publish(ev.make_event(
                    ev.TrialFinished(status="oom", ranks=2, accelerator_s=6.0, wall_s=3.0, peak_memory_bytes=int(8.1 * GIB),
                                     censored_peak_bytes=int(8.1 * GIB), memory_capacity_bytes=8 * GIB, reason="oom"),
                    study_id=study, source="launcher", trial_id="late1", cluster_id="local"))
                _wait(browser, lambda d: "oom" in d.find_element(By.CSS_SELECTOR, row).text, timeout_s=10)
                print(f"new trial shown in Chromium {shown_after_s:.2f}s after its events were published")
                assert shown_after_s < 8.0  # under --poll 10: the doorbell, not the poll
        finally:
            await bus.close()
