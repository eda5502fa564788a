"""The dashboard in a real browser (headless Debian chromium + chromedriver): every view of a live
GRPO run served by its coordinator, then the Stop button, then the same run finished, served by
`rollway dashboard RUN_DIR`. Screenshots go to the test's temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.processes import ServiceProcess
from support.stack import coordinator_stub, start_run
from support.waiting import wait_until

from rollway.coordinator.dashboard import rollout_samples
from rollway.coordinator.v1 import coordinator_pb2

pytestmark = pytest.mark.slow

RUN_ID = "dash-live"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _skip_reason() -> str | None:
    if not CHROMIUM or not CHROMEDRIVER:
        return "headless chromium and chromedriver are not installed (`make browser` installs Debian's)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the dev extra)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _skip_reason()
    if reason:
        print(f"skipping the dashboard's browser tests: {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def live(tmp_path_factory, tiny_model_dir, demo_data_dir, browser):
    """A coordinator (its dashboard on a free port, every span to the run's trace file) running a
    GRPO run long enough to be looked at while it goes; the Stop test ends it."""
    workdir = tmp_path_factory.mktemp("dashboard")
    run_dir = workdir / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    address_file = workdir / "dashboard.address"
    with ExitStack() as stack:
        coordinator = stack.enter_context(
            ServiceProcess(
                "coordinator",
                [
                    "--runs-root",
                    str(workdir / "runs"),
                    "--trace-file",
                    str(run_dir / "trace.jsonl"),
                    "--dashboard-address-file",
                    str(address_file),
                ],  # fmt: skip
                workdir,
            )
        )
        stub = coordinator_stub(coordinator)
        config = {
            "hf_checkpoint": str(tiny_model_dir),
            "prompt_data": [str(demo_data_dir / "rl.parquet")],
            "eval_prompt_data": ["add", str(demo_data_dir / "eval.parquet")],
            "eval_interval": 4,
            "input_key": "prompt",
            "label_key": "label",
            "apply_chat_template": True,
            "rollout_batch_size": 4,
            "n_samples_per_prompt": 4,
            "global_batch_size": 16,
            "num_rollout": 500,  # stopped by the test
            "rollout_max_response_len": 6,
            "rm_type": "exact_match",
            "lr": 1e-3,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 4096,
            "dashboard_rollout_groups": 2,
            "dashboard_trainer_log_probs": True,
        }
        start_run(stub, RUN_ID, config)
        wait_until(lambda: len(records(run_dir)) >= 3, 240.0, "3 steps of the live run")
        yield {"url": address_file.read_text(), "run_dir": run_dir, "stub": stub, "shots": workdir / "shots"}
        stub.StopRun(coordinator_pb2.StopRunRequest(run_id=RUN_ID, immediate=True))


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def api(url: str, path: str):
    with urllib.request.urlopen(f"{url}/api/{path}", timeout=10) as reply:
        return json.loads(reply.read())


def open_view(browser, url: str, view: str) -> None:
    browser.get(f"{url}/?run={RUN_ID}#{view}")
    wait_until(
        lambda: browser.execute_script("return window.rollwayDashboard.run") == RUN_ID, 20.0, "the page"
    )


def shot(browser, live, name: str) -> None:
    live["shots"].mkdir(exist_ok=True)
    browser.save_screenshot(str(live["shots"] / f"{name}.png"))


def js(browser, code: str):
    return browser.execute_script("try { return " + code + " } catch (e) { return null }")


def chart_points(browser, metric: str):
    return js(
        browser, f"window.rollwayDashboard.charts[{json.dumps(metric)}].data[1].filter(v => v != null).length"
    )


def state_cell(browser) -> str:
    return (
        js(browser, f"document.querySelector('tr[data-run={json.dumps(RUN_ID)}] td.state').textContent") or ""
    )


# ---------- the live run ----------
def test_live_runs_view_shows_the_running_run_and_its_config(browser, live):
    open_view(browser, live["url"], "runs")
    wait_until(lambda: state_cell(browser) == "RUNNING", 20.0, "the run's row, RUNNING")
    wait_until(lambda: js(browser, "document.querySelector('#config-given').textContent"), 20.0, "the config")
    given = json.loads(js(browser, "document.querySelector('#config-given').textContent"))
    assert given["num_rollout"] == 500
    resolved = json.loads(js(browser, "document.querySelector('#config-resolved').textContent"))
    assert resolved["trainer"]["lr"] == pytest.approx(1e-3)
    assert js(browser, f"!!document.querySelector('tr[data-run={json.dumps(RUN_ID)}] button.stop')")
    shot(browser, live, "live-runs")


def test_live_metrics_curves_grow_by_server_push(browser, live):
    open_view(browser, live["url"], "metrics")
    wait_until(lambda: chart_points(browser, "rollout/raw_reward"), 20.0, "the reward chart")
    first = chart_points(browser, "rollout/raw_reward")

    def caught_up() -> bool:  # every record of the file is on the chart, more than at first
        count = sum("rollout/raw_reward" in r for r in records(live["run_dir"]))
        return chart_points(browser, "rollout/raw_reward") == count > first

    wait_until(caught_up, 60.0, "new steps on the reward chart without a reload")
    for metric in ("train/loss", "train/grad_norm", "rollout/response_len/mean", "eval/accuracy"):
        assert chart_points(browser, metric), metric
    shot(browser, live, "live-metrics")


def hover_token(browser, position: int):
    from selenium.webdriver.common.action_chains import ActionChains

    token = browser.find_elements("css selector", "#groups .sample .tok")[position]
    ActionChains(browser).move_to_element(token).perform()
    wait_until(
        lambda: js(browser, "document.querySelector('#token-tip').style.display") == "block", 5.0, "the tip"
    )
    return js(browser, "document.querySelector('#token-tip').textContent")


def check_rollouts_view(browser, url: str, run_dir: Path, step: int) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import Select

    open_view(browser, url, "rollouts")
    # Read through JS: a live run re-renders the list as steps arrive (a WebElement may go stale).
    wait_until(lambda: str(step) in js(browser, "[...document.querySelectorAll('#step-select option')].map(o => o.value)"),
               30.0, f"step {step} in the list")  # fmt: skip

    def select_step() -> bool:
        try:
            Select(browser.find_element("id", "step-select")).select_by_value(str(step))
            return True
        except StaleElementReferenceException:
            return False  # re-rendered under us: find it again

    wait_until(select_step, 10.0, f"step {step} selected")
    wait_until(
        lambda: js(browser, "document.querySelector('#groups').dataset.step") == str(step), 10.0, "the step"
    )
    wait_until(lambda: js(browser, "document.querySelectorAll('#groups .tok').length"), 10.0, "tokens")
    stored = rollout_samples.read_step(run_dir, step)
    assert js(browser, "document.querySelectorAll('#groups .group').length") == len(
        {r["group_index"] for r in stored}
    )
    assert js(browser, "document.querySelectorAll('#groups .sample').length") == len(stored)
    tip = hover_token(browser, 1).split("\n")  # the first sample's second token
    assert tip[0].endswith(f"(id {stored[0]['response_token_ids'][1]})")
    values = dict(line.split(": ", 1) for line in tip[1:])
    assert float(values["rollout log-prob"]) == stored[0]["rollout_log_probs"][1]
    assert float(values["trainer − rollout"]) == stored[0]["train_rollout_log_prob_diff"][1]
    Select(browser.find_element("id", "colour-by")).select_by_value("entropy")
    value = js(browser, "document.querySelectorAll('#groups .sample .tok')[1].dataset.value")
    assert float(value) == stored[0]["entropy"][1]
    zero_variance = [len({s["reward"] for s in stored if s["group_index"] == g}) == 1 for g in
                     dict.fromkeys(r["group_index"] for r in stored)]  # fmt: skip
    shown = js(
        browser,
        "[...document.querySelectorAll('#groups .group')].map(g => g.classList.contains('zero-variance'))",
    )
    assert shown == zero_variance


def test_live_rollouts_show_each_token_with_its_values(browser, live):
    check_rollouts_view(browser, live["url"], live["run_dir"], 1)
    shot(browser, live, "live-rollouts")


def test_live_services_show_health_pid_and_weight_version(browser, live):
    open_view(browser, live["url"], "services")

    def rows() -> dict:
        found = js(
            browser,
            "[...document.querySelectorAll('#services-table tbody tr')].map(r => [r.dataset.service, ...[...r.cells].map(c => c.firstChild ? c.firstChild.textContent : '')])",
        )
        return {row[0]: row[1:] for row in found or []}

    wait_until(
        lambda: {"coordinator-0", "dataloader-0", "rollout-0", "trainer-0"} <= rows().keys(), 30.0, "services"
    )
    for name, (_, address, health, pid, *_rest) in rows().items():
        assert health == "SERVING", name
        assert address.startswith("127.0.0.1:")
        os.kill(int(pid), 0)  # the pid shown is a live process
    assert int(rows()["rollout-0"][4]) >= 1  # weights were pushed at least once
    wait_until(
        lambda: js(browser, "document.querySelectorAll('#sync-table tbody tr').length") >= 3, 20.0, "syncs"
    )
    shot(browser, live, "live-services")


def test_live_step_timeline_and_trace(browser, live):
    open_view(browser, live["url"], "timeline")
    wait_until(
        lambda: (js(browser, "window.rollwayDashboard.stacked.phases.plot.data[0].length") or 0) >= 3,
        20.0,
        "steps",
    )
    wait_until(lambda: js(browser, "document.querySelectorAll('#trace rect.span').length"), 20.0, "the trace")
    services = js(
        browser, "[...document.querySelectorAll('#trace text')].map(t => t.textContent.split(':')[0])"
    )
    assert {"coordinator", "dataloader", "rollout", "trainer"} <= set(services)
    shot(browser, live, "live-timeline")


def test_stop_button_stops_the_run(browser, live):
    open_view(browser, live["url"], "runs")
    wait_until(
        lambda: js(browser, f"!!document.querySelector('tr[data-run={json.dumps(RUN_ID)}] button.stop')"),
        20.0,
        "Stop",
    )
    # Clicked in the page: the table is redrawn as the run's progress streams in.
    js(browser, f"document.querySelector('tr[data-run={json.dumps(RUN_ID)}] button.stop').click() || true")
    wait_until(lambda: state_cell(browser) == "STOPPED", 120.0, "the run's row, STOPPED")
    info = live["stub"].GetRun(coordinator_pb2.GetRunRequest(run_id=RUN_ID)).run
    assert info.state == coordinator_pb2.RUN_STATE_STOPPED
    shot(browser, live, "stopped-runs")


# ---------- the same run, finished, from its directory ----------
@pytest.fixture(scope="module")
def finished(live):
    wait_until(lambda: (live["run_dir"] / "status.json").exists(), 60.0, "the run's end")
    # A second run to overlay: a copy of this one's files (its curves are the same points).
    other = live["run_dir"].parent.parent / "others" / "dash-copy"
    shutil.copytree(live["run_dir"], other, ignore=shutil.ignore_patterns("services", "tensorboard"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollway.cli", "dashboard", str(live["run_dir"]), str(other.parent), "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # the address is its first line; it exits on failure
        assert line.startswith("dashboard: http://"), line
        yield line.split(": ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(10)


def test_finished_run_views(browser, live, finished):
    run_dir = live["run_dir"]
    open_view(browser, finished, "runs")
    wait_until(lambda: state_cell(browser) == "STOPPED", 20.0, "the finished run, STOPPED")
    assert not js(browser, "document.querySelector('button.stop')")  # nothing to stop
    shot(browser, live, "finished-runs")

    open_view(browser, finished, "metrics")
    count = sum("train/loss" in r for r in records(run_dir))
    wait_until(lambda: chart_points(browser, "train/loss") == count, 20.0, f"{count} points of train/loss")
    assert api(finished, f"runs/{RUN_ID}/metrics")["records"] == records(run_dir)
    shot(browser, live, "finished-metrics")

    open_view(browser, finished, "runs")  # tick the copy to overlay it
    wait_until(
        lambda: js(browser, "document.querySelector('tr[data-run=\"dash-copy\"] input')"), 20.0, "the copy"
    )
    js(browser, "document.querySelector('tr[data-run=\"dash-copy\"] input').click() || true")
    browser.find_element("css selector", "a[data-view='metrics']").click()

    def overlaid() -> list:  # points of each run's curve
        code = "window.rollwayDashboard.charts['train/loss'].data.slice(1).map(s => s.filter(v => v != null).length)"
        return js(browser, code) or []

    wait_until(lambda: overlaid() == [count, count], 20.0, "both runs' train/loss curves")
    shot(browser, live, "finished-metrics-overlay")

    check_rollouts_view(browser, finished, run_dir, rollout_samples.stored_steps(run_dir)[-1])
    shot(browser, live, "finished-rollouts")

    open_view(browser, finished, "services")
    wait_until(
        lambda: js(browser, "document.querySelectorAll('#services-table tbody tr').length") >= 3, 20.0, "rows"
    )
    healths = js(
        browser, "[...document.querySelectorAll('#services-table tbody tr')].map(r => r.cells[2].textContent)"
    )
    assert set(healths) == {"STOPPED"}
    shot(browser, live, "finished-services")

    open_view(browser, finished, "timeline")
    wait_until(lambda: js(browser, "document.querySelectorAll('#trace rect.span').length"), 20.0, "the trace")
    shot(browser, live, "finished-timeline")
