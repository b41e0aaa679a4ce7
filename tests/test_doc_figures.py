"""docs/mining.md and docs/operating.md say what the code does: every figure on them comes from the
function or constant that computes it, or from a committed measurement.

A *figure* is a number with a unit (s, min, hours, GB, KiB, kB, %, ×, windows, blocks, px, lines,
...). Each one must lie inside a claim below: a phrase of the page built from the code's own value
(`computed`), or a phrase whose figure a committed measurement holds (`measured`: the file and its
phrase). A figure no claim covers fails the test, so a new number needs its source, and a changed
constant fails until the page says it. Out of scope, owned by the sizing work and its own tests:
mining.md §1's memory, disk and network figures, §6's sizing table and §12's per-GPU memory table.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from functools import cache

import pytest

from templar.chain.embedded.store import ChainSpec
from templar.chain.head import HEAD_EXTRAPOLATION_SECONDS
from templar.core.config import DEFAULT_CACHE_GB, REPO_ROOT, load_hparams
from templar.core.startup import OPEN_FILES_NEEDED, OPEN_FILES_WANTED
from templar.dashboard import server as dashboard_server
from templar.dashboard import sources, views
from templar.dashboard.app import WATCH_GRACE
from templar.dashboard.board import BEHIND_WINDOWS, STALE_WINDOWS
from templar.dashboard.jsonl import MAX_LINE_BYTES
from templar.data.plan import MAX_UIDS
from templar.distributed.group import DEFAULT_TIMEOUT_S
from templar.runtime import flags, metrics_server
from templar.runtime.consensus.windows import stop_timeout_seconds, window_times
from templar.tools.sizing import window_sizing

DOCS = REPO_ROOT / "docs"
FIGURE = re.compile(
    r"(?<![\w.§/=-])\d[\d,]*(?:\.\d+)?(?:–\d[\d,]*(?:\.\d+)?)?\s?"
    r"(?:s|min|minutes|hours?|h|GB|GiB|MB|KiB|kB|%|×|windows?|blocks?|px|lines|evaluations)(?![\w])")
OUT_OF_SCOPE = {
    "mining.md": [("## 1. Hardware", "- **Time budget.**"),
                  ("**Sizing of one window, 1.2B run**", "**Data assignment.**"),
                  ("**Memory per GPU**", "Benchmark (`benchmarks/performance/distributed.py`")],
    "operating.md": [],
}


@cache
def text(doc: str) -> str:
    """The page without its fenced code blocks (commands and example log lines are not figures)."""
    return re.sub(r"^```.*?^```", "", (DOCS / doc).read_text(), flags=re.M | re.S)


def g(x: float) -> str:
    return f"{x:g}"


def computed() -> list[tuple[str, str]]:
    """(page, phrase) built from the code's values."""
    hp = load_hparams()
    w, d, gl = hp.windows, hp.data, hp.gauntlet
    window = w.blocks_per_window * w.block_time
    sizing = window_sizing(hp)  # templar hparams' figures (tools.sizing)
    blocking = window_sizing(hp.model_copy(update={"inner": hp.inner.model_copy(update={"overlap": "blocking"})}))
    times = window_times(w, 0, 0.0, window)  # one window, from its first block
    commit_close = window - times.commit_close  # before the window ends
    tail = times.apply_deadline - window
    page_kib = d.sequences_per_page * d.sequence_length * 2 // 1024  # uint16 tokens
    mining = [
        # §1 time budget (templar.runtime.consensus.windows)
        f"A finney window is {w.blocks_per_window} blocks × {g(w.block_time)} s = {g(window)} s",
        f"as `w` ends ({g(w.put_window_seconds)} s, plus the {g(w.clock_skew_seconds)} s clock-skew allowance and "
        f"{g(w.settle_seconds)} s for the last uploads to become visible), the gather takes up to "
        f"{g(w.gather_seconds)} s more",
        f"at the latest {g(tail)} s after `w` ends, when the first {({3: 'two'})[w.lead_slots]} lead slots",
        f"an estimated {100 * sizing['miner_compute_utilisation']:.0f} % at 1.2B on an H100 with the overlapped window",
        f"copies the state file off for its save: {sizing['miner_gpu_overhead_seconds']:.1f} s a window at 1.2B, which "
        f"leaves {sizing['miner_compute_span_seconds']:.1f} s for training",
        f"save before it trained `w+1`: {blocking['miner_compute_span_seconds']:.2f} s for training, "
        f"{blocking['miner_compute_span_min_seconds']:.2f} s when the gather runs to its deadline",
        f"(`commit_close`, {g(commit_close)} s before `w+1` ends)",
        # §6 data
        f"`--data.cache_gb`, default {g(DEFAULT_CACHE_GB)}",
        f"at least {MAX_UIDS} × `pages_per_window`",
        f"{d.sequences_per_page}-sequence pages are {page_kib} KiB",
        # §10 extra pages (gauntlet.extra_work): twice the pages are weighted 2^q
        f"(at most `data.max_extra_pages`, {d.max_extra_pages})",
        f"earn about {2 ** gl.extra_work_exponent:.2f}× an honest miner's weight (2^{g(gl.extra_work_exponent)}",
        f"It costs twice the compute for about {2 ** gl.extra_work_exponent:.2f}× the weight",
        f"paid on their own terms: about {2 ** gl.extra_work_exponent:.2f}× for twice the pages",
        # §9, §10
        f"a whole window plus {tail:.0f} s of put window, clock skew, gather and",
        f"`TimeoutStopSec={stop_timeout_seconds(w, 'miner')}`",
        # §11
        f"(tempo {ChainSpec.tempo} blocks, {ChainSpec.tempo * 12 // 60} minutes)",
        f"within {g(gl.rating_tie_band)}\n  standard errors",
        f"rating ∝ r^{g(gl.rating_exponent)} beyond the band, c = {g(gl.power)}",
        f"after about {_evaluations_to_clear_the_band()} evaluations",
        f"exceeds {g(gl.rating_tie_band)} standard errors",
    ]
    operating = [
        f"more than {BEHIND_WINDOWS} behind the chain's",
        f"no window recorded for {STALE_WINDOWS} windows of wall time",
        f"has recorded no window for {STALE_WINDOWS}\nwindows",
        f"timing of the last {views.TIMING_WINDOWS} windows",
        f"green from {g(views.AGREEMENT_GOOD)}, red below\n{g(views.AGREEMENT_POOR)}",
        f"the status of its last {sources.STRIP_WINDOWS} windows",
        f"weight sparkline of the last {views.SPARK_WINDOWS} windows",
        f"full history (up to {sources.MAX_PEER_RECORDS} windows)",
        f"Below {_phone_width()} px",
        f"fits a {_browser('PHONE')['width']} px screen",
        f"{g(WATCH_GRACE)} s after the last request)",
        f"a line longer than {MAX_LINE_BYTES // 1024} KiB is skipped",
        f"({sources.MAX_WINDOWS:,} windows, {sources.MAX_PEER_RECORDS} records per peer, {sources.MAX_PEERS:,} peers)",
        f"`static/dashboard.js` ({_lines('src/templar/dashboard/static/dashboard.js')} lines",
        f"one block, at least {g(_chain_interval(True))} s ({g(_chain_interval(False))} s off the embedded chain)",
        f"(no window finished\nfor {STALE_WINDOWS} windows)",
        f"(none in {_alert_for('TemplarNoWindowYet')} minutes since start)",
        f"(the lead has finished no window for {STALE_WINDOWS} windows",
        f"`TimeoutStopSec` is {stop_timeout_seconds(w, 'miner')} s\n  for a miner and "
        f"{stop_timeout_seconds(w, 'validator')} s for a validator",
        f"torchrun gives its ranks {_torchrun_grace()} s after a SIGTERM",
        f"a connection whose request is not in {g(dashboard_server.IDLE_SECONDS)} s after it opened",
        f"at most {dashboard_server.CONNECTIONS} are open at once, one more is closed on arrival",
        f"at most\n{metrics_server.CONNECTIONS} connections are served at once (more are closed on arrival), one whose "
        f"whole request is not in\nwithin {g(metrics_server.REQUEST_SECONDS)} s of connecting is closed",
        f"no table scrolls sideways at {_browser('PHONE')['width']} px",
        f"at {_browser('DESKTOP')['width']}×{_browser('DESKTOP')['height']} and "
        f"{_browser('PHONE')['width']}×{_browser('PHONE')['height']}",
    ]
    mining += [
        f"torchrun gives\n  its workers {_torchrun_grace()} s before SIGKILL",
        f"`TEMPLAR_DIST_TIMEOUT` (seconds,\n  default {g(DEFAULT_TIMEOUT_S)})",
        f"(the head: {g(HEAD_EXTRAPOLATION_SECONDS)} s)",
    ]
    # the open-files limit a node asks for, and under which a validator warns (core.startup)
    validating = [f"(up to {OPEN_FILES_WANTED:,})", f"leaves fewer than {OPEN_FILES_NEEDED:,}"]
    operating += [f"the hard one, up to {OPEN_FILES_WANTED:,}", f"a validator under {OPEN_FILES_NEEDED:,}"]
    return ([("mining.md", p) for p in mining] + [("operating.md", p) for p in operating]
            + [("validating.md", p) for p in validating])


MEASURED = [
    # (page, phrase on the page, committed measurement, phrase there)
    ("scoring.md", "one window in 11, 4 or 2 were paid 5.3–8.6×, 2.8–3.5× and 1.8–2.0× an honest miner per unit of compute;\n"
     "with the budget at most 0.09×", "benchmarks/LOG.md", "| 11 | 5.328 / 7.273 / 8.64 | 0.001 / 0.001 / 0.001 |"),
    ("scoring.md", "48 such hotkeys of 256 took 57–59 % of F_t's places and 96 took 71 %, now 3 % and 10 %",
     "benchmarks/LOG.md", "| 48 (no upload, or warm-ups) | 0.577 / 0.589 / 0.573 | 0.033-0.035 |"),
    ("validating.md", "256 miners' commitments held 265 files open at the\npeak", "benchmarks/LOG.md",
     "| 256 | 10 | 265 | 266 | 10 |"),
    ("mining.md", "206 identical honest miners were paid within 1.01–1.02× of each other from the tenth to the\n"
     "  ninetieth percentile at finney's cadence over 48 seeds (1.04–1.40× at the extremes)", "benchmarks/LOG.md",
     "| **m = 5 (production now)** | **30 of 48** | 0.70–4.05 h | **255 of 384 (0.66)** | 0.726 | 1.04–1.40 | 1.008–1.021 |"),
    ("mining.md", "and two validators' weights agreed at 0.993–0.997", "benchmarks/LOG.md",
     "two validators' weights agreed at 0.993–0.997"),
    ("mining.md", "(1.80–2.00× and 0.925–0.935 before", "benchmarks/LOG.md",
     "| **production: μ's tie band 0.2, power 3** | **1.10 / 1.07 / 1.08** | 0.989–0.989 |"),
    ("mining.md", "over 200 simulated runs of\n  its 16 windows 72 % paid at least 1.3×", "benchmarks/LOG.md",
     "| production (q 0.5, τ 0.7) | 1.39 (1.18–1.41) | 72 % |"),
    ("mining.md", "the median newcomer was paid as the median miner within the\n  hour in 30 runs of 48 (0.70–4.05 h "
     "after it joined; at the epoch that first paid them, 0.66 of the\n  newcomers and 0.73 of the identical incumbents "
     "were at the median)", "benchmarks/LOG.md",
     "| **m = 5 (production now)** | **30 of 48** | 0.70–4.05 h | **255 of 384 (0.66)** | 0.726 |"),
    ("mining.md", "the median newcomer was paid as an incumbent within\n  the hour in 43 runs of 48 (0.70–1.59 h)",
     "benchmarks/LOG.md", "| **at least the identical incumbents' 10th percentile** | **43 of 48** | **0.70–1.59 h** |"),
    ("scoring.md", "the median\nnewcomer was paid as an incumbent within the hour in 43 runs of 48 under m = 5 (0.70–1.59 h; LOG §49)",
     "benchmarks/LOG.md", "| **at least the identical incumbents' 10th percentile** | **43 of 48** | **0.70–1.59 h** |"),
    ("scoring.md", "in 40 of 48 on the\nsix runs pooled (0.70–1.52 h)", "benchmarks/LOG.md",
     "| the six runs pooled | 1.05–1.60 (mean 1.15) | 1 (seed 1: 1.60) | 1.011–1.023 | 0.991–0.996 | 24 / 40 of 48 | 0.70–1.52 h |"),
    ("scoring.md", "identical miners stay within 1.5× in 47 runs (1.05–1.60×; the one over is seed 1)", "benchmarks/LOG.md",
     "| the six runs pooled | 1.05–1.60 (mean 1.15) | 1 (seed 1: 1.60) |"),
    ("scoring.md", "rated above the rating's tie band in the lead's book (1.52× the median)", "benchmarks/LOG.md",
     "`honest247` is paid 1.52×"),
    ("scoring.md", "all 48 within 1.22×", "benchmarks/LOG.md", "| pooled fit, band 4.5 | **1.05–1.22 (1.09)** | **0** |"),
    ("mining.md", "a quarter of the work was paid\n  1–12 % of the honest median's weight", "benchmarks/LOG.md",
     "`short` was paid 1.3 / 11.5 / 1.9 % and `thin` 7.4 / 3.6 / 2.9 %"),
    ("scoring.md", "1.18–1.87× at the end, `overclaim` 0.21–0.56×", "benchmarks/LOG.md", "| 1 | 1.18 (1.54) | 0.56 (0.60) |"),
    ("scoring.md", "1.28 / 1.38 / 1.40× when the evaluated pages were drawn", "benchmarks/LOG.md",
     "| **production: one standard error below** | **1.00 / 1.00 / 1.01** | 1.28 / 1.38 / 1.40 |"),
    ("scoring.md", "1.26 / 1.39 / 1.41× before the rating's band below the median", "benchmarks/LOG.md",
     "| μ's tie band 0.2, power 3 | **1.04 / 1.01 / 1.04** | 1.26 / 1.39 / 1.41 |"),
    ("scoring.md", "0.04 / 0.82 / 0.05× in LOG §39's runs", "benchmarks/LOG.md",
     "| 0.29 / 0.14 / 0.12 | 0.04 / 0.82 / 0.05 |"),
    ("scoring.md", "0.04 / 0.22 / 0.03× in LOG §38's runs", "benchmarks/LOG.md",
     "| 0.26 / 0.06 / 0.09 | 0.04 / 0.22 / 0.03 |"),
    ("scoring.md", "0.29 / 0.50 / 0.36× before the band", "benchmarks/LOG.md",
     "| 0.25 / 0.48 / 0.31 | 0.29 / 0.50 / 0.36 | 1.00 / 1.00 / 1.00 |"),
    ("scoring.md", "1.39–1.54× on δ_rand", "benchmarks/LOG.md", "| production | 2 | 1.64 | **1.54** | 3.08 |"),
    ("mining.md", "1.40–1.41× before new miners were drawn first until five evaluations, §42", "benchmarks/LOG.md",
     "| **in proportion** | **1.00 / 1.00 / 1.02** | **1.40 / 1.41 / 1.41** |"),
    ("mining.md", "both classes, 1.28–1.40×", "benchmarks/LOG.md",
     "| **production: one standard error below** | **1.00 / 1.00 / 1.01** | 1.28 / 1.38 / 1.40 |"),
    ("mining.md", "0.01–0.15× before new miners were drawn first until five evaluations, §42", "benchmarks/LOG.md",
     "| **1.40 / 1.41 / 1.41** | **0.01 / 0.10 / 0.15** |"),
    ("scoring.md", "1.40 / 1.41 / 1.41× the honest median on 8-page windows", "benchmarks/LOG.md",
     "| **in proportion** | **1.00 / 1.00 / 1.02** | **1.40 / 1.41 / 1.41** |"),
    ("scoring.md", "0.01 / 0.10 / 0.15× the weakest honest miner per trained token", "benchmarks/LOG.md",
     "| **1.40 / 1.41 / 1.41** | **0.01 / 0.10 / 0.15** |"),
    ("mining.md", "1.41× the honest median in the crowded localnet at each of three seeds", "benchmarks/LOG.md",
     "| 1.41 / 1.41 / 1.41 (1.40 / 1.41 / 1.41) |"),
    ("mining.md", "(0.02–0.28× the weakest\n  honest miner's pay per trained token at twice the pages", "benchmarks/LOG.md",
     "| 0.02 / 0.28 / 0.18 (0.01 / 0.10 / 0.15) |"),
    ("scoring.md", "1.41 / 1.41 / 1.41× the honest median on 8-page windows", "benchmarks/LOG.md",
     "| 1.41 / 1.41 / 1.41 (1.40 / 1.41 / 1.41) |"),
    ("scoring.md", "0.02 / 0.28 / 0.18× the weakest honest miner per trained token", "benchmarks/LOG.md",
     "| 0.02 / 0.28 / 0.18 (0.01 / 0.10 / 0.15) |"),
    ("mining.md", "it took more than 7\n  hours", "benchmarks/LOG.md", "| paper settings (before) | 0.24 h | > 7 h |"),
    ("mining.md", "1.3–2.7 hours with the ramp's", "benchmarks/LOG.md", "1.3–2.4 h (2.7 h at tempo 360)"),
    ("mining.md", "by about 10 % more than a typical miner's", "benchmarks/LOG.md",
     "`moredata` δ_rand 1.105 ± 0.084"),
    ("mining.md", "earned\n  about 2× an honest miner's incentive", "benchmarks/LOG.md",
     "| `moredata` above honest | 5.7–7.6× | 4.0–4.3× | 2.04–2.25× |"),
    ("mining.md", "from 1× to 13–17× in one window of a\n  20-window localnet", "benchmarks/LOG.md",
     "into 13–17× an honest miner"),
    ("mining.md", "(8 miners each)\n  shared at most 0.12 %", "benchmarks/LOG.md", "every cheat ≤ 0.12 %"),
    ("mining.md", "1.2 % above blocking's loss at equal tokens over 90 windows where delayed is 3.8 %",
     "benchmarks/LOG.md", "| signed (production's rule) | 6.382 | 6.626 (1.038×) | 6.457 (1.012×) |"),
    ("mining.md", "and 0.4 % at eager's own best inner rate", "benchmarks/LOG.md",
     "| outer 0.003 | 6.457 (1.012×) | **6.408 (1.004×)** | 6.424 (1.007×) |"),
]


def _evaluations_to_clear_the_band() -> int:
    """n with lead > band · σ/√n, from the simulator's measured spread and moredata's lead."""
    fit = json.loads((REPO_ROOT / "benchmarks" / "results" / "subnet_sim_fit.json").read_text())["summary"]
    lead = fit["moredata"]["rand_mean_sd"][0] - fit["honest"]["rand_mean_sd"][0]
    sigma = fit["honest"]["rand_mean_sd"][1]
    return math.ceil((load_hparams().gauntlet.rating_tie_band * sigma / lead) ** 2)


def _phone_width() -> int:
    css = (REPO_ROOT / "src" / "templar" / "dashboard" / "static" / "dashboard.css").read_text()
    return int(re.search(r"@media \(max-width: (\d+)px\)\s*\{\s*header", css).group(1))


def _browser(name: str) -> dict:
    source = (REPO_ROOT / "tests" / "dashboard" / "test_browser.py").read_text()
    return json.loads(re.search(rf"^{name} = (\{{.*\}})$", source, re.M).group(1).replace("'", '"'))


def _lines(path: str) -> int:
    return len((REPO_ROOT / path).read_text().splitlines())


def _chain_interval(embedded: bool) -> float:
    """`templar dashboard`'s default: max(2, one block) on the embedded chain, else max(2, 12)."""
    from templar.dashboard import cli

    source = inspect.getsource(cli.board_config)
    assert 'max(2.0, hp.windows.block_time if network == "embedded" else 12.0)' in source
    return 2.0 if embedded else 12.0


def _alert_for(name: str) -> int:
    import yaml

    rules = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus" / "templar-alerts.yml").read_text())
    rule = next(r for group in rules["groups"] for r in group["rules"] if r["alert"] == name)
    assert rule["for"].endswith("m")
    return int(rule["for"][:-1])


def _torchrun_grace() -> int:
    """The seconds torchrun's agent gives its workers between SIGTERM and SIGKILL."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    return inspect.signature(PContext.close).parameters["timeout"].default


def test_the_exit_code_tables_are_the_codes():
    """operating.md §8 holds the table of exit codes (mining.md's §10 names them and points there)."""
    codes = {flags.EXIT_NOT_REGISTERED: "hotkey is not registered", flags.EXIT_CONFIG: "configuration",
             flags.EXIT_OWN_BUCKET: "our own bucket refused", flags.EXIT_STATE_LOCKED: "another process holds",
             flags.EXIT_STATE_DISK: "the state directory could not be written"}
    operating, mining = text("operating.md"), text("mining.md")
    for code, words in codes.items():
        assert re.search(rf"^\| {code} \| [^|]*{re.escape(words)}", operating, re.M), (code, words)
        assert re.search(rf"\b{code} [a-z]", mining), code
    from templar.miner.loop import MAX_FAILED_UPLOADS
    from templar.runtime.node import MAX_FAILED_SAVES

    assert f"refused {MAX_FAILED_UPLOADS} uploads in a row" in operating
    assert {3: "three"}[MAX_FAILED_SAVES] + " windows in a row" in operating
    assert "`0 kB in 0.00s`" in mining and "(1 kB = 1,000 bytes)" in mining
    assert re.search(r"_bytes / 1e3:\.0f\} kB", (REPO_ROOT / "src" / "templar" / "miner" / "loop.py").read_text())


def test_the_data_figures_are_the_runs():
    hp = load_hparams()
    d = hp.data
    mining = text("mining.md")
    assert (f"`sequences_per_page` ({d.sequences_per_page}) sequences of `sequence_length` "
            f"({d.sequence_length:,})") in " ".join(mining.split())
    assert (f"`pages_per_window` ({d.pages_per_window}) pages: "
            f"{d.pages_per_window * d.sequences_per_page * d.sequence_length:,} tokens in "
            f"`inner.steps` ({hp.inner.steps}) AdamW steps") in " ".join(mining.split())
    assert f"(`eval_pages` {d.eval_pages})" in mining and f"at least {MAX_UIDS} × `pages_per_window`" in mining
    w = hp.windows
    assert f"`max_allowed_stale` ({w.max_allowed_stale}) windows old" in mining
    assert f"(`warmup_windows`: {w.warmup_windows})" in mining
    assert w.max_allowed_stale + 2 == 12 and "so the bucket holds about a dozen of each" in " ".join(mining.split())
    assert "w − (`max_allowed_stale` + 2)," in " ".join(mining.split())
    assert f"N/{hp.sync.fingerprint_positions} fingerprint positions" in mining
    assert f"G = {hp.gauntlet.top_g} peer" in " ".join(mining.split())


@pytest.mark.parametrize("doc, phrase", computed())
def test_a_computed_figure_is_on_the_page(doc, phrase):
    assert " ".join(phrase.split()) in " ".join(text(doc).split()), f"{doc} no longer says: {phrase!r}"


@pytest.mark.parametrize("doc, phrase, source, there", MEASURED)
def test_a_measured_figure_is_on_the_page_and_in_its_measurement(doc, phrase, source, there):
    assert " ".join(phrase.split()) in " ".join(text(doc).split()), f"{doc} no longer says: {phrase!r}"
    body = (REPO_ROOT / source).read_text()
    if source.endswith(".json"):  # "run|key|value;...": each run's figure, rounded as the page prints it
        results = json.loads(body)["results"]
        for item in there.split(";"):
            run, key, value = item.split("|")
            assert f"{results[run][key]:.{len(value.split('.')[1])}f}" == value, (run, key, results[run][key])
    else:
        assert there in body, f"{source} does not hold {there!r}"


def test_every_figure_on_the_pages_has_a_claim():
    claims = [(doc, p) for doc, p in computed()] + [(doc, p) for doc, p, _, _ in MEASURED]
    exempt = {
        # the paper's window against an H100: the sizing model's figure (tools/sizing.py), out of scope
        "mining.md": ["~400k tokens in one step, which left an H100 idle 83 % of the window",
                      # example lines of logs, marked as such on the page
                      "`gathered 15/15 peers, 12.40 MB; ok=15`", "`0 kB in 0.00s`", "(1 kB = 1,000 bytes)",
                      "refused 5 uploads in a row", "three windows in a row",
                      # a localnet's and the tests' run lengths, not figures of the code
                      "after 4 windows", "a 4-window localnet", "a 20-window localnet", "a 12-window run"],
        "operating.md": [],
    }
    for doc in ("mining.md", "operating.md"):
        flat = " ".join(text(doc).split())
        covered = [False] * len(flat)
        for start, end in OUT_OF_SCOPE[doc]:
            a = flat.index(" ".join(start.split()))
            b = flat.index(" ".join(end.split()), a)
            covered[a:b] = [True] * (b - a)
        for phrase in [p for d, p in claims if d == doc] + exempt[doc]:
            needle = " ".join(phrase.split())
            for m in re.finditer(re.escape(needle), flat):
                covered[m.start():m.end()] = [True] * (m.end() - m.start())
        loose = [flat[max(0, m.start() - 40):m.end() + 10] for m in FIGURE.finditer(flat)
                 if not all(covered[m.start():m.end()])]
        assert not loose, f"{doc}: figures with no claim (say where each comes from):\n" + "\n".join(loose)


def test_the_miners_help_says_what_extra_pages_earn(capsys):
    """`neurons/miner.py --help` and mining.md §10 agree: declared extra pages, trained, pay 2^q for
    twice the pages on production's rules; declared and untrained, less than not declaring."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("miner_entry", REPO_ROOT / "neurons" / "miner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    premium = f"{2 ** load_hparams().gauntlet.extra_work_exponent:.2f}x"
    assert f"twice the pages earns about {premium}" in help_text and "mining.md §10" in help_text
    assert "Declaring pages you do not train pays less than not declaring" in help_text
    assert "declaring pages you do not train earns less than not declaring them" in " ".join(text("mining.md").split())
