"""`camrender play --model tiny` end to end in a real headless browser (Debian's chromium + chromedriver
through Selenium): hold W for a few segments then D, see frames arrive, Stop; the saved path moved forward
and then turned right as the official scheme says, and `camrender render --from-render` gives the same
frames; a second flight: the page's status before the first frame, the video scaled to the window and full
screen, the icon, a reload that keeps the flight; Ctrl-C while a third flight renders saves it and ends the
server cleanly.

Without chromium the tests skip on a developer machine; under CI=true (`.ci/run`) they fail instead.
"""
import asyncio
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from camrender import trajectory

# the tests fly one module-scoped server's flights in order (flight 1, 2, 3): one xdist worker runs them all
pytestmark = pytest.mark.xdist_group("play_browser")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver")


def need_browser():
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
               if path is None or not Path(path).exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        message = f"the browser tests need {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + ": CI must run them")
        pytest.skip(message)


def env():
    """The subprocesses' environment: this tree first; one torch thread (the tiny model's ops are too small
    to split, and on a busy CI machine idle threads spinning between ops cost more than the work); the
    PyTorch references, as on a user's CPU (module fixtures start before tests/conftest.py's `_kernel_path`)."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`camrender play --model tiny` on a free port: (process, url, session stem)."""
    need_browser()
    folder = tmp_path_factory.mktemp("play")
    stem = folder / "flight"
    process = subprocess.Popen([sys.executable, "-m", "camrender", "play", "--model", "tiny", "--port", "0",
                                "--height", "32", "--width", "48", "--max-seconds", "30", "--seed", "11",
                                "--prompt", "a garden", "--out", str(stem)],
                               stdout=subprocess.PIPE, stderr=open(folder / "stderr.txt", "w"), text=True, env=env())
    # the URL once it listens (a server that hangs while loading fails here, instead of hanging the suite)
    ready, _, _ = select.select([process.stdout], [], [], 300)
    url = process.stdout.readline().strip() if ready else ""
    assert url.startswith("http://127.0.0.1:"), (folder / "stderr.txt").read_text()
    yield process, url, stem
    if process.poll() is None:
        process.kill()
        process.wait()


def open_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def page_state(driver) -> dict:
    return driver.execute_script("return JSON.parse(JSON.stringify(window.camrenderPlay || {}))")


def wait_for(driver, condition, timeout=120.0, what="the page"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = page_state(driver)
        if condition(state):
            return state
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {state}")


def yaw_degrees(c2w) -> np.ndarray:
    """Heading of each pose: + when the forward axis turned toward +x (right)."""
    return np.degrees(np.arctan2(c2w[:, 0, 2], c2w[:, 2, 2]))


@pytest.fixture(scope="module")
def flight(server):
    """Hold W for three segments, then D for three, Stop: (page state at the end, saved files). A key
    pressed while segment k shows steers segment k + 2 (k + 1 is decided as k is sent), so three segments
    hold at least one whole segment of each key."""
    _, url, _ = server
    browser = open_browser()
    try:
        return fly(browser, url)
    finally:
        browser.quit()  # the page closes: the later tests run without the browser's load


def fly(browser, url):
    from selenium.webdriver.common.action_chains import ActionChains

    browser.get(url)
    state = wait_for(browser, lambda s: s.get("received", 0) > 0 and s.get("role") == "steer", what="first frames")
    keys = ActionChains(browser)
    keys.key_down("w").perform()
    start = state["segments"]
    wait_for(browser, lambda s: s["segments"] >= start + 3, what="three segments with W")
    keys.key_up("w").key_down("d").perform()
    start = page_state(browser)["segments"]
    wait_for(browser, lambda s: s["segments"] >= start + 3, what="three segments with D")
    keys.key_up("d").perform()
    browser.find_element("id", "stop").click()
    state = wait_for(browser, lambda s: s.get("ended"), what="the saved session")
    wait_for(browser, lambda s: s["shown"] >= s["received"] and s["latencies"], timeout=30, what="playback")
    return page_state(browser), {key: Path(path) for key, path in state["saved"].items()}


def test_flying_w_then_d_moves_forward_then_turns_right(flight):
    state, saved = flight
    assert state["error"] is None and set(saved) == {"video", "trajectory", "render"}
    assert state["received"] == state["shown"] >= 25 + 6 * 24  # every frame arrived and was played
    assert all(0 < lat < 60 for lat in state["latencies"])  # key-to-frame, measured on the page
    path = trajectory.load(saved["trajectory"])
    assert path.num_frames == state["received"] and path.seed == 11 and path.prompt == "a garden"
    c2w, yaw = path.c2w, yaw_degrees(path.c2w)
    steps = np.linalg.norm(np.diff(c2w[:, :3, 3], axis=0), axis=1)
    turns = np.diff(yaw)
    moving, turning = np.flatnonzero(steps > 1e-9), np.flatnonzero(np.abs(turns) > 1e-9)
    assert len(moving) and len(turning) and moving[0] < turning[0]  # forward first, then the turn
    # the official scheme: a fresh press snaps to full speed, 0.025 units and 0.6 degrees per frame
    assert math.isclose(steps[moving[0]], 0.025, rel_tol=1e-6) and steps.max() <= 0.025 + 1e-9
    assert math.isclose(turns[turning[0]], 0.6, rel_tol=1e-6) and turns.max() <= 0.6 + 1e-9
    assert (turns >= -1e-9).all() and yaw[-1] > 0.6 * 12  # right only, for at least half a segment
    before_turn = c2w[turning[0], :3, 3]
    assert before_turn[2] > 0.025 * 12 and abs(before_turn[0]) < 1e-9  # straight ahead along +z
    ahead = c2w[turning[0]:, :3, 2]  # forward axes after the turn began stay level (no pitch keys)
    assert np.allclose(ahead[:, 1], 0, atol=1e-9)


def test_the_saved_render_reproduces_the_frames(flight, tmp_path):
    import imageio.v3 as iio

    _, saved = flight
    again = tmp_path / "again.mp4"
    result = subprocess.run([sys.executable, "-m", "camrender", "render", "--from-render", str(saved["render"]),
                             "--out", str(again)], capture_output=True, text=True, env=env(), timeout=300)
    assert result.returncode == 0, result.stderr
    live, offline = iio.imread(saved["video"]), iio.imread(again)
    assert live.shape == offline.shape and live.shape[1:] == (32, 48, 3)
    np.testing.assert_array_equal(offline, live)
    settings = json.loads(saved["render"].read_text())["settings"]
    assert settings["seed"] == 11 and settings["noise_frames"] > settings["num_frames"] // 8


def test_the_page_scales_the_video_and_a_reload_keeps_the_flight(server, flight):
    """A second flight: before its first frame the page says what renders; the video fills the window at its
    aspect ratio (Full screen: the screen); the icon is served; a reload steers the same flight on; Stop."""
    _, url, stem = server
    browser = open_browser()
    try:
        browser.get(url)
        state = wait_for(browser, lambda s: s.get("received", 0) > 0 and s.get("role") == "steer", what="frames")
        assert state["flight"] == 2 and state["phases"][:2] == [
            "preparing: the prompt, the noise of the whole flight", "rendering segment 1 of 20"]
        width, height, inner = browser.execute_script(
            "const r = document.getElementById('view').getBoundingClientRect();"
            "return [r.width, r.height, [window.innerWidth, window.innerHeight]]")
        assert abs(width / height - 48 / 32) < 0.02 and width > 4 * 48 and width <= inner[0] and height < inner[1]
        assert browser.execute_script("return fetch('/favicon.svg').then(r => r.status)") == 200
        assert browser.find_element("css selector", "link[rel=icon]").get_attribute("href").endswith("/favicon.svg")
        browser.find_element("id", "full").click()
        shown = browser.execute_script("return [document.fullscreenElement && document.fullscreenElement.id, "
                                       "document.getElementById('view').getBoundingClientRect().width, innerWidth]")
        assert shown[0] == "view" and shown[1] == shown[2]
        browser.refresh()  # the page goes and comes back: the flight waits for it and goes on
        state = wait_for(browser, lambda s: s.get("received", 0) > 0 and s.get("role") == "steer", what="frames again")
        assert state["flight"] == 2 and "seed" not in state  # no "started": the same flight, not a new one
        browser.find_element("id", "stop").click()
        state = wait_for(browser, lambda s: s.get("ended"), what="the saved session")
        assert state["saved"]["trajectory"].endswith("flight-2.traj.json")
        path = trajectory.load(state["saved"]["trajectory"])
        assert path.num_frames >= 25 + state["received"]  # the frames before the reload are in it too
    finally:
        browser.quit()


def test_ctrl_c_while_flying_saves_the_flight_and_exits_0(server, flight):
    """Another page steers (a WebSocket client; the browser is closed), then Ctrl-C (SIGINT) while the
    flight renders: the flight is saved as FLIGHT-3, the server exits 0 and leaves no partial files."""
    process, url, stem = server

    async def steering_page(session):
        """A WebSocket the server takes as the steering page, and its hello. Until the server has seen the
        closed browser's socket go (`browser.quit()` returns first), a new page only watches: connect again."""
        deadline = time.monotonic() + 30
        while True:
            ws = await session.ws_connect(url + "ws")
            hello = json.loads((await ws.receive(timeout=60)).data)
            if hello["role"] == "steer" or time.monotonic() > deadline:
                return ws, hello
            await ws.close()
            await asyncio.sleep(0.1)

    async def steer_then_interrupt():
        async with aiohttp.ClientSession() as session:
            ws, hello = await steering_page(session)
            assert hello["type"] == "hello" and hello["role"] == "steer", hello  # the browser's page left
            seen = [hello]
            async with ws:
                await ws.send_str(json.dumps({"type": "key", "key": "w", "down": True, "id": 1}))
                async for message in ws:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        seen.append(json.loads(message.data))
                        if seen[-1]["type"] == "segment" and seen[-1]["index"] == 0:
                            process.send_signal(signal.SIGINT)
        return seen

    # bounded: a server that never sends segment 0 or never closes the socket fails the test, not the suite
    seen = asyncio.run(asyncio.wait_for(steer_then_interrupt(), 300))
    assert process.wait(timeout=60) == 0
    ended = [m for m in seen if m["type"] == "ended"]
    assert ended and ended[0]["frames"] >= 25 and ended[0]["saved"]["trajectory"].endswith("flight-3.traj.json")
    assert trajectory.load(ended[0]["saved"]["trajectory"]).num_frames == ended[0]["frames"]
    assert not list(stem.parent.glob(".*"))  # no partial files
