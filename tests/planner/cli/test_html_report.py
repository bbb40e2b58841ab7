"""Tests `planner/cli/html_report.py`: a self-contained page, and that a real browser renders it.

The browser test needs Chromium (Debian: ``apt-get install -y chromium``); without it, it is skipped.
"""

import re
import shutil
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from costmodel.hardware.machine import machine_for
from costmodel.hardware.registry import load_hardware
from costmodel.step.simulator import simulate
from planner.api import plan
from planner.cli.html_report import html_report

_SECTIONS = ("Mesh", "Step time", "Memory per device", "Pipeline timeline", "Alternatives and why they lost")


@pytest.fixture(scope="module")
def pipelined():
    p = plan("llama3-70b", mesh="pipeline=8,tensor=4", hardware="h100-sxm")  # a mesh whose axis names pin a pipeline
    assert p.layout.pp > 1  # the timeline has stages to draw
    events = simulate(p.model, p.train, p.layout, machine_for(load_hardware("h100-sxm")), keep_timeline=True).timeline
    return p, html_report(p, devices_per_node=8, timeline=events)


def test_page_is_self_contained(pipelined):
    _, page = pipelined
    assert not re.search(r"(?i)<script|<link|<img|<iframe|\bsrc=|url\(|@import|https?://", page)


def test_page_has_every_section_and_the_numbers(pipelined):
    p, page = pipelined
    for title in _SECTIONS:
        assert f"<h2>{title}" in page
    assert f"{p.predicted.step_time_s:.3f} s" in page and "HBM 80 GiB" in page
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
