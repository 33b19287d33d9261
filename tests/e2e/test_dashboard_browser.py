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
from support.synthetic_study import GIB, _measured, synthetic_study, write_workload

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(900)]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
VIEWS = ("studies", "summary", "search", "history", "importance", "slices", "pairs", "trials", "cost", "doctor", "verify", "invariants", "agent")


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
                # its launch was published in the same batch, but a catch-up may land between the two
                _wait(browser, lambda d: "running" in d.find_element(By.CSS_SELECTOR, row).text, timeout_s=10)
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


def _rows_shown(driver) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('#trials-table tbody tr')].map((r) => r.dataset.trial)")


def _column(driver, key: str) -> list[str]:
    """The text of one column of the trials table as shown (found by its header's sort key)."""
    return driver.execute_script(
        "const i = [...document.querySelectorAll('#trials-table thead th')].findIndex((th) => th.dataset.sort === arguments[0]);"
        "return [...document.querySelectorAll('#trials-table tbody tr')].map((r) => r.children[i].textContent)", key)


def _predicted_trial(study: str, trial_id: str, step_s: float, *, steps: int = 0) -> list[ev.Event]:
    """A search trial the language model proposed with the models' prediction, launched, its probe's per-step
    records on both ranks (``steps`` of them), finished and measured at ``step_s``."""
    cand = ev.Candidate(knobs={"micro_batch_size": 4, "compile": True}, patches=["fused-qkv"])

    def event(payload, source):
        return ev.make_event(payload, study_id=study, source=source, trial_id=trial_id, cluster_id="local")

    return [
        event(ev.TrialProposed(candidate=cand, candidate_key=cand.key(), kind="search", origin="llm", reason="larger GEMMs",
                               prediction=ev.Prediction(step_time_s=0.16, step_time_std_log=0.1, peak_memory_bytes=3.4 * GIB,
                                                        p_oom=0.05)), "proposer"),
        event(ev.TrialLaunched(backend="local", workdir=f"/tmp/{trial_id}", command=["python", "train.py"], nodes=1, ranks=2,
                               host="localhost", job_id="77"), "launcher"),
        *[event(ev.TrialStep(rank=rank, world_size=2, step=step, loss=4.0 - 0.1 * step, step_time_s=step_s * (1 + 0.01 * rank),
                             tokens=8192, optimizer_steps=step, peak_memory_bytes=3 * GIB), "probe")
          for step in range(1, steps + 1) for rank in (0, 1)],
        event(ev.TrialFinished(status="ok", ranks=2, accelerator_s=24.0, wall_s=12.0, peak_memory_bytes=int(3.5 * GIB),
                               memory_capacity_bytes=8 * GIB, steps_completed=60), "launcher"),
        event(_measured(cand.key(), "search", step_s, None, steps=60, peak=int(3.5 * GIB)), "telemetry"),
    ]


async def test_the_trials_table_sorts_and_filters_and_a_trial_has_its_own_page_in_chromium(browser, tmp_path):
    """optuna-dashboard's search views: the trials table sorted by a column and filtered by origin, a knob's value
    and a patch, kept sorted as the live update adds a row; the optimisation history and the step-time EDF with
    one point per trial behind them; a trial's page with its knobs, the proposer's prediction beside the
    measurement, its per-step series and its invariants."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    data = tmp_path / "data"
    study = ev.new_id()
    with EmbeddedServer.start(data, authorize=True) as server:
        bus = await Bus.connect(server.url, service="admin", data_dir=data)
        try:
            log = synthetic_study(study, write_workload(tmp_path / "workload"), seed=4)
            log += _predicted_trial(study, "pred1", 0.15, steps=6)
            await bus.publish_many(log)
            proposed = {e.trial_id: e.payload for e in log if e.type == "TrialProposed"}
            measured = {e.trial_id: e.payload for e in log if e.type == "TrialMeasured"}
            finished = {e.trial_id: e.payload for e in log if e.type == "TrialFinished"}
            browser.get("about:blank")
            browser.get_log("browser")  # what an earlier test's page logged (its server gone) is not this test's
            with running_dashboard("--nats-url", server.url, "dashboard", "--port", "0", "--poll", "10",
                                   data_dir=data) as page:
                browser.get(page)
                rows = "#trials-table tbody tr"
                _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == len(proposed))

                # Sorted by the step time: the measured trials fastest first, then those that measured none.
                browser.find_element(By.CSS_SELECTOR, '#trials-table th[data-sort="step_time_s"]').click()
                fastest_first = sorted(measured, key=lambda t: measured[t].step_time_s)
                _wait(browser, lambda d: _rows_shown(d)[: len(measured)] == fastest_first, timeout_s=10)
                assert set(_rows_shown(browser)[len(measured):]) == set(proposed) - set(measured)
                assert all(cell == "" for cell in _column(browser, "step_time_s")[len(measured):])
                # Again: the other way, the trials without a step time still last.
                browser.find_element(By.CSS_SELECTOR, '#trials-table th[data-sort="step_time_s"]').click()
                _wait(browser, lambda d: _rows_shown(d)[: len(measured)] == fastest_first[::-1], timeout_s=10)
                # By a knob: its values in order, the trials that left it at the golden value ("·") last.
                browser.find_element(By.CSS_SELECTOR, '#trials-table th[data-sort="knob:micro_batch_size"]').click()
                set_mb = [int(p.candidate.knobs["micro_batch_size"]) for p in proposed.values()
                          if "micro_batch_size" in p.candidate.knobs]
                _wait(browser, lambda d: _column(d, "knob:micro_batch_size")
                      == [str(v) for v in sorted(set_mb)] + ["·"] * (len(proposed) - len(set_mb)), timeout_s=10)
                # By predicted against measured: only pred1 has a prediction and a measurement.
                browser.find_element(By.CSS_SELECTOR, '#trials-table th[data-sort="step_vs_predicted"]').click()
                _wait(browser, lambda d: _rows_shown(d)[0] == "pred1", timeout_s=10)
                assert _column(browser, "step_vs_predicted")[0] == f"{0.15 / 0.16:.2f}"

                # Filters: an origin, a knob's value, a patch.
                Select(browser.find_element(By.ID, "filter-origin")).select_by_value("llm")
                _wait(browser, lambda d: _rows_shown(d) == ["pred1"], timeout_s=10)
                Select(browser.find_element(By.ID, "filter-origin")).select_by_value("")
                Select(browser.find_element(By.ID, "filter-knob")).select_by_value("micro_batch_size")
                Select(browser.find_element(By.ID, "filter-knob-value")).select_by_value("8")
                at_8 = {t for t, p in proposed.items() if p.candidate.knobs.get("micro_batch_size") == 8}
                _wait(browser, lambda d: set(_rows_shown(d)) == at_8, timeout_s=10)
                Select(browser.find_element(By.ID, "filter-knob-value")).select_by_value("golden")
                golden = {t for t, p in proposed.items() if "micro_batch_size" not in p.candidate.knobs}
                _wait(browser, lambda d: set(_rows_shown(d)) == golden, timeout_s=10)
                Select(browser.find_element(By.ID, "filter-knob")).select_by_value("")
                browser.find_element(By.ID, "filter-patch").send_keys("fused")
                with_patch = {t for t, p in proposed.items() if "fused-qkv" in p.candidate.patches}
                _wait(browser, lambda d: set(_rows_shown(d)) == with_patch, timeout_s=10)
                browser.find_element(By.ID, "filter-patch").clear()
                browser.execute_script("document.getElementById('filter-patch').dispatchEvent(new Event('input'))")
                _wait(browser, lambda d: len(_rows_shown(d)) == len(proposed), timeout_s=10)

                # The history: one point per trial with a final outcome (every trial here), measured ones at their
                # step time, failed ones marked; the best line the lowest search step time that ran ok.
                history = browser.execute_script(
                    "return document.getElementById('plot-history').data.map((t) => ({name: t.name, x: t.x, y: t.y}))")
                by_name = {t["name"]: t for t in history}
                drawn = sum(len(t["x"]) for name, t in by_name.items() if name != "best search trial so far")
                assert drawn == len(proposed)
                assert len(by_name["out of memory"]["x"]) == sum(f.status == "oom" for f in finished.values())
                assert len(by_name["other failure (crash, timeout, refused)"]["x"]) == sum(
                    f.status not in ("ok", "oom") for f in finished.values())
                assert sorted(y for name, t in by_name.items() if name in {"doctor", "search", "verify"} for y in t["y"]) \
                    == pytest.approx(sorted(m.step_time_s for m in measured.values()))
                ok_search = [m.step_time_s for t, m in measured.items()
                             if proposed[t].kind == "search" and m.invariants_ok and finished[t].status == "ok"]
                assert by_name["best search trial so far"]["y"][-1] == pytest.approx(min(ok_search))
                # The EDF: per kind, the step times of the trials that ran ok, sorted, climbing by 1/n to 1.
                edf = browser.execute_script(
                    "return document.getElementById('plot-edf').data.map((t) => ({name: t.name, x: t.x, y: t.y}))")
                search_edf = next(t for t in edf if t["name"].startswith("search"))
                assert search_edf["x"] == pytest.approx(sorted(ok_search))
                assert search_edf["y"] == pytest.approx([(i + 1) / len(ok_search) for i in range(len(ok_search))])
                assert {t["name"].split(" ")[0] for t in edf} == {"doctor", "search", "verify"}

                shots = tmp_path / "shots"
                shots.mkdir()
                # Live: sorted by the step time, a newly measured, faster trial lands first.
                browser.find_element(By.CSS_SELECTOR, '#trials-table th[data-sort="step_time_s"]').click()
                _wait(browser, lambda d: _rows_shown(d)[0] == fastest_first[0], timeout_s=10)
                await bus.publish_many(_predicted_trial(study, "late2", 0.5 * min(m.step_time_s for m in measured.values())))
                _wait(browser, lambda d: _rows_shown(d)[:2] == ["late2", fastest_first[0]], timeout_s=15)
                assert len(_rows_shown(browser)) == len(proposed) + 1
                element = browser.find_element(By.ID, "view-history")
                browser.execute_script("arguments[0].scrollIntoView()", element)
                element.screenshot(str(shots / "dashboard-history.png"))

                # pred1's own page, from its row's link.
                browser.find_element(By.CSS_SELECTOR, '#trials-table tr[data-trial="pred1"] a.trial-link').click()
                _wait(browser, lambda d: "pred1" in d.find_element(By.ID, "trial-title").text, timeout_s=15)
                candidate = browser.find_element(By.ID, "trial-candidate").text
                assert "knob micro_batch_size 4" in candidate and "knob compile true" in candidate
                assert "fused-qkv" in candidate and "llm" in candidate and "larger GEMMs" in candidate
                # read in one script: a live update may re-render the page between two element reads
                cells = lambda row: browser.execute_script(  # noqa: E731
                    "return [...document.querySelectorAll(`#trial-prediction tr[data-row='${arguments[0]}'] td`)]"
                    ".map((c) => c.innerText)", row)
                assert cells("step") == ["0.1600", "0.1500", f"{0.15 / 0.16:.3f}"]
                assert cells("peak")[:2] == ["3.400", "3.500"]
                assert cells("oom")[:2] == ["0.050", "no"]
                run = browser.find_element(By.ID, "trial-run").text
                assert "accelerator-s 24.0" in run and "local · localhost · job 77" in run
                assert "loss" in browser.find_element(By.ID, "trial-invariants").text
                _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#plot-trial-steps .main-svg"), timeout_s=10)
                series = browser.execute_script(
                    "return document.getElementById('plot-trial-steps').data.map((t) => ({name: t.name, x: t.x, y: t.y}))")
                steps = {t["name"]: t for t in series}
                assert steps["step time, rank 0"]["x"] == [1, 2, 3, 4, 5, 6]
                assert steps["step time, rank 1"]["y"] == pytest.approx([0.15 * 1.01] * 6)
                assert steps["loss (probe, rank 0)"]["y"] == pytest.approx([4.0 - 0.1 * s for s in range(1, 7)])
                browser.set_window_size(1500, 1500)  # the page and its step plot in one picture
                try:
                    browser.find_element(By.ID, "view-trial").screenshot(str(shots / "dashboard-trial.png"))
                finally:
                    browser.set_window_size(1500, 1000)

                # A trial that ran out of memory: its page says why, and that the prediction did not expect it.
                browser.get(f"{page}?study={study}&trial=search2")
                _wait(browser, lambda d: "search2" in d.find_element(By.ID, "trial-title").text, timeout_s=15)
                assert "failure reason oom" in browser.find_element(By.ID, "trial-run").text
                assert cells("oom")[1] == "yes"
                assert "No per-step record" in browser.find_element(By.ID, "trial-steps-note").text
                # An unknown trial is named, not a blank page.
                browser.get(f"{page}?study={study}&trial=nosuch")
                _wait(browser, lambda d: "no trial 'nosuch'" in d.find_element(By.ID, "trial-missing").text, timeout_s=15)

                errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "404" not in e["message"]]
                assert not errors, errors
                for shot in shots.iterdir():
                    assert shot.stat().st_size > 5_000, shot
                if os.environ.get("INFRARSI_DOCS_SCREENSHOTS") == "1":
                    for shot in shots.iterdir():
                        shutil.copyfile(shot, DOCS_IMG / shot.name)
        finally:
            await bus.close()
