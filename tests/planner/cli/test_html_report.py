"""Tests `planner/cli/html_report.py`: a self-contained page, and that a real browser renders it.

Geometry is checked twice: from the SVG attributes (every bar, line and label, at the report's
widest character, inside its SVG) and, with Chromium (Debian: ``apt-get install -y chromium``;
without it those tests are skipped), from the bounding boxes the browser lays out, read back by
a measuring script added to a copy of the page.
"""

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest

from costmodel.hardware.machine import machine_for
from costmodel.hardware.registry import load_hardware
from costmodel.step.simulator import simulate
from planner.api import plan
from planner.cli.html_report import _CHAR_W, _TIME_PARTS, html_report

_SECTIONS = ("Mesh", "Step time", "Memory per device", "Pipeline timeline", "Alternatives and why they lost")


@pytest.fixture(scope="module")
def pipelined():
    p = plan("llama3-70b", mesh="pipeline=8,tensor=4", hardware="h100-sxm")  # a mesh whose axis names pin a pipeline
    assert p.layout.pp > 1  # the timeline has stages to draw
    events = simulate(p.model, p.train, p.layout, machine_for(load_hardware("h100-sxm")), keep_timeline=True).timeline
    return p, html_report(p, devices_per_node=8, timeline=events)


@pytest.fixture(scope="module")
def serving():
    """A decode plan: serving terms in the header, a KV cache in the memory bar."""
    p = plan("llama3-70b", devices=8, hardware="h100-sxm", workload="decode", global_batch=1, seq_len=4096)
    return p, html_report(p, devices_per_node=8)


@pytest.fixture(scope="module")
def narrow():
    """A two-device mesh (its grid narrower than its labels) and no timeline."""
    return html_report(plan("gpt2", mesh="data=2", hardware="a100-80gb", global_batch=16), devices_per_node=8)


def _svgs(page):
    return [ET.fromstring(svg) for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S)]


def test_every_bar_line_and_label_lies_inside_its_svg_by_its_attributes(pipelined, narrow, serving):
    for page in (pipelined[1], narrow, serving[1]):
        for svg in _svgs(page):
            width, height = float(svg.get("width")), float(svg.get("height"))
            for el in svg:
                if el.tag == "rect":
                    right, bottom = float(el.get("x")) + float(el.get("width")), float(el.get("y")) + float(el.get("height"))
                elif el.tag == "line":
                    right, bottom = max(float(el.get("x1")), float(el.get("x2"))), max(float(el.get("y1")), float(el.get("y2")))
                else:
                    right, bottom = float(el.get("x")) + _CHAR_W * len(el.text), float(el.get("y"))
                assert right <= width and bottom <= height, (svg.get("aria-label"), ET.tostring(el)[:120], width, height)


def test_the_step_time_bar_spans_its_parts_in_proportion(pipelined):
    p, page = pipelined
    step_svg = _svgs(page.split("<h2>Step time")[1])[0]
    rects = [(float(r.get("x")), float(r.get("width"))) for r in step_svg.iter("rect")]
    assert sum(w for _, w in rects) == pytest.approx(max(x + w for x, w in rects) - rects[0][0], abs=0.5)
    parts = [getattr(p.predicted.breakdown, field) for _, field, _ in _TIME_PARTS]
    assert [w / sum(w for _, w in rects) for _, w in rects] == pytest.approx([v / sum(parts) for v in parts], abs=0.002)


def test_the_memory_line_is_drawn_at_the_planners_fit_limit_usable_less_reserve(pipelined, serving):
    for p, page in (pipelined, serving):
        mem = p.predicted.memory
        memory_svg = _svgs(page.split("<h2>Memory per device")[1])[0]
        bars = [r for r in memory_svg.iter("rect")]
        line = next(memory_svg.iter("line"))
        # The bars' scale: the chosen plan's stacked parts span its total.
        chosen = [r for r in bars if float(r.get("y")) == float(bars[0].get("y"))]
        px_per_gib = sum(float(r.get("width")) for r in chosen) / (mem.total_bytes / 2**30)
        limit_gib = (mem.hbm_bytes - mem.reserve_bytes) / 2**30
        assert mem.reserve_bytes > 0
        assert float(line.get("x1")) == pytest.approx(240 + px_per_gib * limit_gib, abs=1)  # each width drawn to 0.1 px
        assert any(t.text == f"fit limit {mem.limit_text()}" for t in memory_svg.iter("text"))


def test_a_serving_page_shows_serving_terms_only(serving):
    p, page = serving
    head = page.split("<h2>")[0]
    assert f"time per output token <b>{p.predicted.time_per_output_token_s * 1e3:.2f} ms</b>" in head
    assert "time to first token" in head and "replica(s) of" in head and "decode: batch 1, context 4096" in head
    assert "why this layout" in head
    for training_term in ("micro-batch", "recompute", "ZeRO", "MFU", "global batch", "interleave"):
        assert training_term not in head
    alternatives = page.split("<h2>Alternatives")[1]
    assert p.alternatives and not re.search(r"\bmb\d| z\d", alternatives)
    assert "KV cache" in page.split("<h2>Memory per device")[1]


def test_page_is_self_contained(pipelined):
    _, page = pipelined
    assert not re.search(r"(?i)<script|<link|<img|<iframe|\bsrc=|url\(|@import|https?://", page)


def test_page_has_every_section_and_the_numbers(pipelined):
    p, page = pipelined
    for title in _SECTIONS:
        assert f"<h2>{title}" in page
    assert f"{p.predicted.step_time_s:.3f} s" in page and "fit limit 75.7 GiB (79.6 usable − 4.0 reserved)" in page
    assert page.count("<rect") >= p.layout.n_devices + len(p.alternatives)
    assert all(f"{a.step_time_s:.3f} s" in page for a in p.alternatives)


def test_plan_cli_writes_the_page_to_out(tmp_path):
    out = tmp_path / "plan.html"
    run = subprocess.run([sys.executable, "-m", "planner.cli", "--model", "llama3-8b", "--mesh", "data=4,tensor=2",
                          "--format", "html", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and out.read_text().startswith("<!DOCTYPE html>") and "tensor" in out.read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium: apt-get install -y chromium")
def test_chromium_renders_the_page(pipelined, tmp_path):
    p, page = pipelined
    html, png = tmp_path / "plan.html", tmp_path / "plan.png"
    html.write_text(page)
    flags = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run([*flags, f"--screenshot={png}", "--window-size=1200,1800", html.as_uri()], capture_output=True, timeout=120,
                   check=True)
    dom = subprocess.run([*flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    for text in (*_SECTIONS, "llama3-70b on 32× h100-sxm", "stage 7"):
        assert text in dom
    rgb = matplotlib.image.imread(png)[..., :3]
    assert rgb.shape[:2] == (1800, 1200)
    non_white = (rgb < 0.95).any(axis=-1).mean()
    compute_blue = (np.abs(rgb - np.array([0x4E, 0x79, 0xA7]) / 255).max(axis=-1) < 0.02).sum()
    assert non_white > 0.05 and compute_blue > 1000  # drawn bars, not an empty or error page


_MEASURE = """<script>
const rows = [];
document.querySelectorAll('svg').forEach((svg, i) => {
  const box = svg.getBoundingClientRect();
  svg.querySelectorAll('rect, text, line').forEach(el => {
    const b = el.getBoundingClientRect();
    rows.push({svg: i, tag: el.tagName, text: el.textContent.slice(0, 40), left: b.left - box.left, right: b.right - box.left,
               top: b.top - box.top, bottom: b.bottom - box.top, width: box.width, height: box.height});
  });
});
const out = document.createElement('pre');
out.id = 'geometry';
out.textContent = JSON.stringify(rows);
document.body.appendChild(out);
</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Chromium: apt-get install -y chromium")
@pytest.mark.parametrize("which", ["pipelined", "narrow", "serving"])
def test_chromium_lays_out_every_bar_line_and_label_inside_its_svg(pipelined, narrow, serving, which, tmp_path):
    page = {"pipelined": pipelined[1], "narrow": narrow, "serving": serving[1]}[which]
    html = tmp_path / "measured.html"
    html.write_text(page.replace("</body>", _MEASURE + "</body>"))  # a copy: the report itself has no scripts
    flags = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1800"]
    dom = subprocess.run([*flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    rows = json.loads(re.search(r"<pre id=\"geometry\">(.*?)</pre>", dom, flags=re.S).group(1).replace("&amp;", "&"))
    assert len(rows) > 10 and {r["tag"] for r in rows} >= {"rect", "text"}
    outside = [r for r in rows if r["left"] < -0.5 or r["top"] < -0.5 or r["right"] > r["width"] + 0.5
               or r["bottom"] > r["height"] + 0.5]
    assert not outside, outside[:5]
