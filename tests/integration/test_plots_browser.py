"""The `dvc plots show` page in a real browser with the network unplugged: headless Chromium (no
proxy that answers, every host name unresolvable) draws every chart from the inlined vega
libraries (.dvc/plots/page.html) and its network log has nothing but the page's own file.

Chromium is part of the test environment: `.ci/run` installs it, and where it is missing the test
fails rather than skips, so CI cannot pass without having looked.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from scratch import run
from test_plots import BARS, CURVES, fabricate_run, specs_in_page

from fasttrain.layout import VARIANTS

pytestmark = pytest.mark.slow

OFFLINE = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--disable-background-networking", "--disable-component-update", "--no-first-run"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium not found: the plots page is tested in a real browser; "
                    "install it (Debian: apt-get install -y chromium, as .ci/run does)")
    return found


def browse(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp / 'profile'}", *OFFLINE, "--virtual-time-budget=20000", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)


def drawn_charts(dom: str, plot_ids: set[str]) -> dict[str, int]:
    """vega's marks (an SVG or a canvas) under each plot's div of the rendered DOM."""
    starts = sorted((m.start(), m.group(1)) for m in re.finditer(r'<div id="([^"]+)"', dom) if m.group(1) in plot_ids)
    counts = dict.fromkeys(plot_ids, 0)
    for mark in re.finditer(r'<(?:svg|canvas)[^>]*class="marks"', dom):
        owner = [plot for start, plot in starts if start < mark.start()]
        if owner:
            counts[owner[-1]] += 1
    return counts


def page_requests(netlog: Path) -> set[str]:
    """The URLs the page asked the network for, from Chromium's NetLog: requests with an initiator.

    file:// loads never reach the network stack; the browser's own background calls (Google
    sign-in, time, spelling dictionaries: blocked here too) are "not an origin"-initiated."""
    log = json.loads(netlog.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return {event["params"].get("url", "?") for event in log["events"]
            if event["type"] == start_job and event.get("params", {}).get("initiator") not in (None, "not an origin")}


def assert_draws_offline(page: Path, tmp: Path, charts: int) -> Path:
    """Every chart of a `dvc plots show` page drawn with the network unplugged, nothing asked of
    the network; returns a screenshot of its top."""
    html = page.read_text()
    assert "cdn.jsdelivr.net" not in html and "<script src" not in html  # nothing to fetch
    plot_ids = set(specs_in_page(html))
    assert len(plot_ids) == charts, sorted(plot_ids)

    dom = browse(page, tmp, f"--log-net-log={tmp / 'net.json'}", "--dump-dom").stdout
    counts = drawn_charts(dom, plot_ids)
    assert counts == dict.fromkeys(plot_ids, 1), {p: n for p, n in counts.items() if n != 1}
    assert page_requests(tmp / "net.json") == set()

    shot = tmp / "plots.png"
    browse(page, tmp, f"--screenshot={shot}", "--window-size=1000,1400")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return shot


def test_plots_page_draws_every_chart_offline(tiny_repo, tmp_path):
    fabricate_run(tiny_repo, seed=0)
    run(["dvc", "plots", "show", "-o", str(tmp_path / "show")], tiny_repo)
    assert_draws_offline(tmp_path / "show" / "index.html", tmp_path, len(CURVES) + len(BARS) + 2 * len(VARIANTS))
