"""The HTML report: one self-contained page (no script, no network, figures inside), every name
from the profile escaped, the split's sections present; and the same page in a real headless
browser (Debian's chromium driven by Playwright): it loads with no console error and no
request, its figures render, a screenshot has content, and a layer named
``<script>alert(1)</script>`` shows as that text."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import stagesplit
from helpers import PROFILES
from stagesplit.cli import main
from stagesplit.reporting.html import report_html

HOSTILE = "<script>alert(1)</script>"


def hostile_profile(folder: Path) -> Path:
    """A per-layer GPU profile whose layer and profile names are HTML."""
    layers = [{"name": "embed_tokens", "weights": 2**30, "activations": 2**26, "output": 2**24, "compute": 1e9}]
    layers += [{"name": f"layers.{i}", "weights": 2**31, "activations": 2**28, "output": 2**24, "compute": 4e12}
               for i in range(6)]
    layers[3]["name"] = HOSTILE
    layers.append({"name": "lm_head", "weights": 2**30, "activations": 2**26, "output": 2**24, "compute": 2e12})
    doc = {"format": "stagesplit-profile", "version": 1, "kind": "layers", "name": "<b>bold & \"quoted\"</b>",
           "target": "a100-40gb", "training": True, "compute_unit": "flops", "layers": layers}
    path = folder / "hostile.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    profile = hostile_profile(folder)
    plan = folder / "plan.json"
    assert main(["solve", str(profile), "--devices", "4", "--schedule", "1f1b", "--out", str(plan)]) == 0
    page = folder / "report.html"
    assert main(["report", str(plan), str(profile), "-o", str(page)]) == 0
    return page


def test_the_page_escapes_every_name_and_has_no_script(hostile_report):
    text = hostile_report.read_text()
    assert "<script" not in text.lower()
    assert text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 2          # the layers table and the stages
    assert "&lt;b&gt;bold &amp; &quot;quoted&quot;&lt;/b&gt;" in text
    # nothing to fetch: every src is a data: URL, no link element, no url(...) in the style
    assert re.findall(r'src="([a-z]+):', text) and set(re.findall(r'src="([a-z]+):', text)) == {"data"}
    assert "<link" not in text and "url(" not in text and "http://" not in text and "https://" not in text
    assert "default-src 'none'" in text


def test_the_page_has_every_section(hostile_report):
    text = hostile_report.read_text()
    for heading in ("The split", "Memory of each stage", "The schedule", "Layers",
                    "Compared with what you would do otherwise", "Export"):
        assert f"<h2>{heading}</h2>" in text
    assert 'class="why">why: ' in text
    assert text.count("data:image/png;base64,") == 3                     # stages, Gantt, memory per rank
    assert "stagesplit export --to torch-pipelining" in text and "Megatron&#x27;s even layout" in text


def test_plan_plot_and_report_from_python(tmp_path):
    plan = stagesplit.solve(PROFILES / "llama-7b-layers.json", 4, schedule="1f1b", compare=True)
    fig = plan.plot()
    from matplotlib.figure import Figure
    assert isinstance(fig, Figure) and fig.axes[0].get_ylabel() == "device memory (GiB)"
    plan.report(tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert "1f1b: 4 ranks, 4 micro-batches" in text or "data:image/png" in text
    assert "Megatron&#x27;s even layout" in text                           # baselines from the solve
    # a plan read back from its file has no cost model: the report still renders, with less
    stagesplit.write_plan(plan, tmp_path / "plan.json")
    assert stagesplit.report(tmp_path / "plan.json", tmp_path / "r2.html") == str(tmp_path / "r2.html")
    bare = (tmp_path / "r2.html").read_text()
    assert "<h2>The schedule</h2>" in bare and "why:" not in bare and "Compared with" not in bare


def test_a_report_for_another_profile_is_refused(tmp_path):
    plan = stagesplit.solve(PROFILES / "llama-7b-layers.json", 4)
    stagesplit.write_plan(plan, tmp_path / "plan.json")
    with pytest.raises(stagesplit.StagesplitError, match="the plan was made for llama-7b-like with 34 layers"):
        stagesplit.report(tmp_path / "plan.json", tmp_path / "r.html", PROFILES / "bert-base.stagesplit")


def test_an_ipu_report_speaks_tiles(tmp_path):
    plan = stagesplit.solve(PROFILES / "bert-base.stagesplit", 4, compare=True)
    text = report_html(plan)
    assert "worst tile (KiB)" in text or "worst tile bytes" in text
    assert "stagesplit export --to poptorch" in text and "PopLiner&#x27;s greedy" in text
    assert "GiB" not in text.split("<h2>Layers</h2>")[0].split("<h2>The split</h2>")[1].split("Memory of each")[0]


# -- in a real browser ------------------------------------------------------------------------------

def _browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                                   "(pip install playwright)")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium)")
    return sync_api, executable


def test_the_report_in_a_headless_browser(hostile_report, tmp_path):
    sync_api, executable = _browser()
    url = hostile_report.resolve().as_uri()
    console, errors, requests, dialogs = [], [], [], []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: console.append((m.type, m.text)))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(url, wait_until="load")
            images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, "
                                   "i.naturalHeight, i.getBoundingClientRect().width])")
            cells = page.locator("td").all_inner_texts()
            title = page.title()
            shot = tmp_path / "page.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert [c for c in console if c[0] in ("error", "warning")] == [] and errors == []
    assert [u for u in requests if u != url and not u.startswith("data:")] == []
    assert dialogs == []                                                   # the layer name never ran
    assert len(images) == 3 and all(ok and w > 300 and h > 150 and shown > 300 for ok, w, h, shown in images)
    assert HOSTILE in cells                                                # shown as the text it is
    assert title == 'stagesplit plan: <b>bold & "quoted"</b>'
    from matplotlib.image import imread
    pixels = imread(shot)
    assert pixels.shape[0] > 2000 and pixels.shape[1] >= 1280
    ink = (pixels[..., :3] < 0.85).any(axis=-1)                           # not white
    assert 0.03 < ink.mean() < 0.6 and np.unique(pixels.reshape(-1, pixels.shape[-1])[::97], axis=0).shape[0] > 20
