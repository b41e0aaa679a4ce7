"""The dashboard as a person uses it, in a real Chromium (Debian's, driven by Playwright, offline).

One browser for the module. Each test loads pages from the dashboard serving a real run
directory and a running embedded chain, checks what is on screen, and saves screenshots at
1280×800 and at a phone's 390×844 under the test's own tmp dir (the path is printed).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import serve_chain_only, serve_localnet
from .runfixture import MINERS, VALIDATORS, Run, build_run, miner_window, score_window

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (apt-get install -y chromium; "
                "scripts/bootstrap.sh does it when run as root)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed (dev extra)")

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Run, object]]:
    run = build_run(tmp_path_factory.mktemp("browser") / "localnet")
    dash = serve_localnet(run.out)
    yield run, dash
    dash.stop()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    out = tmp_path / "screenshots"
    out.mkdir()
    print(f"screenshots in {out}")
    return out


class Watch:
    """A page plus what it did: console errors, and every URL it requested (all must be ours)."""

    def __init__(self, browser, base: str, viewport: dict):
        self.page = browser.new_page(viewport=viewport)
        self.base = base
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))

    def goto(self, path: str = "") -> object:
        self.page.goto(self.base + path.lstrip("/"))
        self.page.wait_for_selector("#live-state.on", timeout=15_000)  # the live stream is connected
        return self.page

    def check(self) -> None:
        assert not self.errors, self.errors
        foreign = [u for u in self.requests if not u.startswith(self.base) and not u.startswith("data:")]
        assert not foreign, foreign
        self.page.close()


def test_overview_is_clear_at_desktop_and_phone_width(browser, live, shots):
    run, dash = live
    last = json.loads((run.state_dir("validator0") / "validator_windows.jsonl").read_text().splitlines()[-1])
    for name, viewport in (("overview-1280x800", DESKTOP), ("overview-phone", PHONE)):
        w = Watch(browser, dash.url, viewport)
        page = w.goto("/")
        assert page.inner_text("#c-loss .v") == f"{last['holdout_loss']:.4f}"
        assert page.inner_text("#c-step .v") == str(last["global_step"])
        assert page.locator("svg.chart").count() == 2
        assert page.locator("#agreement tbody tr").count() == len(VALIDATORS)
        assert page.locator(".problems").count() == 0
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], f"{name}: page is {width}px wide"  # no sideways scrolling
        page.screenshot(path=str(shots / f"{name}.png"))
        w.check()


def test_peers_table_matches_the_score_book_and_sorts(browser, live, shots):
    run, dash = live
    book = json.loads((run.state_dir("validator0") / "scorebook.json").read_text())["peers"]
    w = Watch(browser, dash.url, DESKTOP)
    page = w.goto("/peers")
    rows = page.locator("#peers tbody tr")
    assert rows.count() == len(book) - 1 == len(MINERS)  # the subnet owner's uid 0 is in the book, not a peer
    for i in range(rows.count()):
        row = rows.nth(i)
        hotkey = row.get_attribute("data-hotkey")
        cells = row.locator("td")
        assert int(cells.nth(0).inner_text()) == book[hotkey]["uid"]
        assert cells.nth(6).inner_text() == f"{book[hotkey]['mu']:+.3f}"
        float(cells.nth(7).inner_text())  # μ̃, the μ the score reads (its value: test_app's /api/peers)
        assert cells.nth(10).inner_text() == f"{book[hotkey]['weight']:.3f}"
        assert (cells.nth(11).inner_text() == "✓") == (book[hotkey]["weight"] > 0)

    def column(index: int) -> list[float]:
        return [float(x) for x in page.locator(f"#peers tbody tr td:nth-child({index + 1})").all_inner_texts()]

    page.click("#peers th:has-text('uid')")  # numbers: largest first
    assert column(0) == sorted(column(0), reverse=True)
    page.click("#peers th:has-text('uid')")
    assert column(0) == sorted(column(0))
    page.click("#peers th:has-text('weight') >> nth=0")
    assert column(10) == sorted(column(10), reverse=True)
    assert page.get_attribute("#peers th:has-text('weight') >> nth=0", "aria-sort") == "descending"
    page.screenshot(path=str(shots / "peers-1280x800.png"), full_page=True)
    w.check()
    w = Watch(browser, dash.url, PHONE)
    page = w.goto("/peers")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(shots / "peers-phone.png"), full_page=True)
    w.check()


def test_a_peer_page_says_why_it_was_penalised(browser, live, shots):
    run, dash = live
    w = Watch(browser, dash.url, DESKTOP)
    page = w.goto("/peers")
    page.click("#peers a:has-text('lazy0')")
    page.wait_for_url(f"**/peers/{run.node('lazy0').hotkey}")
    page.wait_for_selector("#live-state.on")
    text = page.inner_text("main")
    assert "miner / lazy" in text and "Why it was penalised" in text
    assert "did not beat" in text and "no proof of its assigned work" in text
    assert page.locator("#history tbody tr").count() == run.last_window
    page.screenshot(path=str(shots / "peer-lazy-1280x800.png"), full_page=True)
    w.check()
    w = Watch(browser, dash.url, DESKTOP)
    page = w.goto(f"/peers/{run.node('late0').hotkey}")
    assert "uploaded after the put window closed" in page.inner_text("main")
    w.check()
    w = Watch(browser, dash.url, PHONE)
    page = w.goto(f"/peers/{run.node('lazy0').hotkey}")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=str(shots / "peer-lazy-phone.png"), full_page=True)
    w.check()


def test_miner_pages(browser, live, shots):
    _, dash = live
    w = Watch(browser, dash.url, DESKTOP)
    page = w.goto("/miners")
    assert page.locator("#miners tbody tr").count() == len(MINERS)
    page.click("#miners a:has-text('miner0')")
    page.wait_for_url("**/miners/miner0")
    page.wait_for_selector("#live-state.on")
    text = page.inner_text("main")
    assert "[SYNC] Active: full participation" in text and "last aggregate applied" in text
    assert page.locator("svg.chart").count() == 4
    page.screenshot(path=str(shots / "miner-1280x800.png"), full_page=True)
    w.check()


def test_a_new_window_arrives_live_without_a_reload(browser, live, shots):
    run, dash = live
    overview = Watch(browser, dash.url, DESKTOP)
    page = overview.goto("/")
    page.evaluate("window.__notReloaded = 42")
    peers = Watch(browser, dash.url, DESKTOP)
    peers_page = peers.goto("/peers")
    peers_page.click("#peers th:has-text('uid')")
    peers_page.click("#peers th:has-text('uid')")  # ascending, kept across the live update
    version = page.get_attribute("#live", "data-version")

    window, idx, loss = run.last_window + 1, run.last_window, 5.4321
    rng = random.Random(11)
    for name in VALIDATORS:
        score_window(run.books[name], window, idx, run.nodes, run.state_dir(name), rng, loss)
    for name, strategy in MINERS.items():
        miner_window(run.state_dir(name), window, idx, strategy, rng)

    # expect() polls without eval, which the page's Content-Security-Policy forbids
    sync_api.expect(page.locator("#c-loss .v")).to_have_text("5.4321", timeout=30_000)
    assert page.evaluate("window.__notReloaded") == 42
    assert page.get_attribute("#live", "data-version") != version
    assert "updated" in page.inner_text("#live-state")
    sync_api.expect(peers_page.locator("main h2")).to_contain_text(f"window {window}", timeout=30_000)
    uids = [int(x) for x in peers_page.locator("#peers tbody tr td:nth-child(1)").all_inner_texts()]
    assert uids == sorted(uids)
    page.screenshot(path=str(shots / "overview-live-1280x800.png"))
    overview.check()
    peers.check()


OVERFLOWING = """() => Array.from(document.querySelectorAll('.scroll'))
    .filter(s => s.scrollWidth > s.clientWidth)
    .map(s => { const t = s.querySelector('table'); return (t && t.id) + ': ' + s.scrollWidth + '>' + s.clientWidth; })"""


def test_every_table_fits_a_phone_and_the_run_state_is_said(browser, live, shots):
    """At 390 px no table scrolls sideways (docs/operating.md §2: secondary columns drop); the run's
    state line is green only because windows arrive, and the status strip's legend is on the Peers page."""
    run, dash = live
    for path in ("/", "/peers", f"/peers/{run.node('lazy0').hotkey}", "/miners", "/miners/miner0"):
        w = Watch(browser, dash.url, PHONE)
        page = w.goto(path)
        assert page.evaluate(OVERFLOWING) == [], path
        assert page.locator("#run-state").count() == 1, path
        w.check()
    w = Watch(browser, dash.url, DESKTOP)
    page = w.goto("/peers")
    assert page.locator("#run-state.live").count() == 1  # this fixture's windows are being written
    assert page.locator("#strip-legend").is_visible() and "failed fast evaluation" in page.inner_text("#strip-legend")
    assert "live" not in page.inner_text("#live-state")  # the connection indicator does not claim the run is live
    page.screenshot(path=str(shots / "peers-legend-1280x800.png"))
    w.check()


def test_the_chain_alone_fits_a_phone_and_says_each_role(browser, live, shots):
    """An operator without a validator's state directory sees the chain's subnet table: each neuron's role as
    its commitment declares it (and its permit where the two part), and at 390 px it does not scroll sideways."""
    run, _ = live
    dash = serve_chain_only(run.out)
    try:
        for viewport, name in ((PHONE, "phone"), (DESKTOP, "1280x800")):
            w = Watch(browser, dash.url, viewport)
            page = w.goto("/peers")
            table = page.locator("#subnet")
            assert table.count() == 1 and "role" in table.inner_text() and "miner" in table.inner_text()
            page.screenshot(path=str(shots / f"subnet-{name}.png"), full_page=True)
            assert page.evaluate(OVERFLOWING) == [], name
            w.check()
    finally:
        dash.stop()
