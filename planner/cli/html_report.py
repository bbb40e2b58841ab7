"""`plan --format html`: one self-contained HTML page (inline CSS and SVG, no scripts, no links).

The mesh (devices coloured by node, what each axis carries, which links it crosses), the
step-time breakdown, memory per device as stacked bars against the limit a plan must fit in
(usable memory less the runtime reserve), the pipeline timeline and the alternatives with why
they lost. The header names a training plan's terms (micro-batch, recompute, ZeRO) and a serving
plan's (latencies, replicas, the workload), as the text summary does.

>>> from planner.api import plan
>>> page = html_report(plan("gpt2", mesh="2x2", hardware="a100-80gb", global_batch=16), devices_per_node=8)
>>> page.startswith("<!DOCTYPE html>") and "http" not in page.split("<body>")[1]
True
"""

from __future__ import annotations

from html import escape

from costmodel.inputs.layout import Layout
from costmodel.step.schedules import TimelineEvent
from planner.cli.tables import workload_label
from planner.plan_schema import Plan

_GIB = 2**30
_MAX_DRAWN_DEVICES = 512  # beyond this the grid is a blur: the axis table says it all
_MAX_EVENTS = 4000
_SVG_W = 900  # pixels of a bar chart's drawing
_LABEL_W = 240  # pixels left of every bar, for its label
_VALUE_W = 100  # pixels right of the longest bar, for its value
_BAR_W = _SVG_W - _LABEL_W - _VALUE_W  # the longest bar: every bar and label stays inside its SVG
_CHAR_W = 7  # pixels a character of the 11 px SVG font takes at most, on average over a label
_TIME_PARTS = (("compute", "compute_s", "#4e79a7"), ("memory-bound", "memory_bound_s", "#59a14f"),
               ("recompute", "recompute_s", "#edc948"), ("pipeline bubble", "bubble_s", "#bab0ac"),
               ("exposed communication", "exposed_comm_s", "#e15759"), ("optimizer", "optimizer_s", "#b07aa1"),
               ("offload: exposed device-host copies", "offload_transfer_s", "#9c755f"),
               ("offload: CPU Adam", "cpu_optimizer_s", "#ff9da7"))
_MEMORY_PARTS = (("parameters", "params_bytes", "#4e79a7"), ("gradients", "grads_bytes", "#f28e2b"),
                 ("optimizer state", "optimizer_bytes", "#b07aa1"), ("activations", "activations_bytes", "#59a14f"),
                 ("temporary", "temporary_bytes", "#bab0ac"), ("KV cache", "kv_cache_bytes", "#76b7b2"))
_NODE_COLOURS = ("#dbe9f6", "#fde2c8", "#d9f0d3", "#f6d5e5", "#e6e0f3", "#fff3bf", "#d0f0ef", "#eeeeee")
_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
.big{font-size:18px}.muted{color:#666}.key span{display:inline-block;width:11px;height:11px;margin:0 4px 0 12px}
svg text{font:11px system-ui,sans-serif}"""


def html_report(plan: Plan, *, devices_per_node: int, timeline: tuple[TimelineEvent, ...] = ()) -> str:
    """The page for ``plan``; ``timeline`` from ``simulate(..., keep_timeline=True)`` draws the pipeline."""
    head = _training_head(plan) if plan.train.workload.runs_backward else _serving_head(plan)
    body = "".join((f"<h1>{escape(plan.model.name)} on {plan.layout.n_devices}× {escape(plan.hardware)}</h1>", head,
                    _mesh(plan, devices_per_node), _step_time(plan), _memory(plan), _pipeline(plan, timeline),
                    _alternatives(plan)))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Plan: {escape(plan.model.name)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>\n")


def _training_head(plan: Plan) -> str:
    """The step's figures and the layout's training terms."""
    est, lay = plan.predicted, plan.layout
    return (f"<p class='big'>step time <b>{est.step_time_s:.3f} s</b> · MFU <b>{est.mfu:.1%}</b> · "
            f"{est.tokens_per_s:,.0f} tokens/s</p><p class='muted'>dp {lay.dp} · tp {lay.tp} · pp {lay.pp} "
            f"(interleave {lay.interleave}) · cp {lay.cp} · micro-batch {lay.micro_batch} · {lay.recompute} recompute · "
            f"ZeRO {lay.zero_stage}{' · sequence parallel' if lay.sequence_parallel else ''} · "
            f"global batch {plan.train.global_batch} × {plan.train.seq_len} tokens · planner {escape(plan.solver.planner)}</p>")


def _serving_head(plan: Plan) -> str:
    """The latencies, the replicas and the workload: a serving plan has no micro-batch, recompute or ZeRO to show."""
    est, lay = plan.predicted, plan.layout
    why = f"<p class='muted'>why this layout: {escape(plan.solver.objective)}</p>" if plan.solver.objective else ""
    return (f"<p class='big'>time per output token <b>{est.time_per_output_token_s * 1e3:.2f} ms</b> · time to first token "
            f"<b>{est.time_to_first_token_s * 1e3:.1f} ms</b> · {est.tokens_per_s:,.0f} tokens/s</p><p class='muted'>dp {lay.dp} · "
            f"tp {lay.tp} · pp {lay.pp} · {lay.dp} replica(s) of {lay.tp * lay.pp} device(s) · "
            f"{escape(workload_label(plan.train))} · planner {escape(plan.solver.planner)}</p>{why}")


def _key(parts: tuple[tuple[str, str, str], ...]) -> str:
    return "<p class='key'>" + "".join(f"<span style='background:{c}'></span>{name}" for name, _, c in parts) + "</p>"


def _mesh(plan: Plan, devices_per_node: int) -> str:
    rows = "".join(f"<tr><td>{escape(a.name)}</td><td>{a.size}</td><td><b>{a.parallelism}</b></td>"
                   f"<td>{escape(' + '.join(a.links) or '-')}</td><td>{a.nodes_spanned}</td></tr>" for a in plan.mesh)
    table = ("<table><tr><th>mesh axis</th><th>size</th><th>carries</th><th>links crossed</th><th>nodes per group</th></tr>"
             f"{rows}</table>")
    n = plan.layout.n_devices
    if n > _MAX_DRAWN_DEVICES:
        return f"<h2>Mesh</h2>{table}<p class='muted'>{n} devices: too many to draw.</p>"
    cols = plan.mesh[-1].size
    rows_n = n // cols
    cell = max(14, min(40, 900 // cols))
    cells = []
    for d in range(n):
        r, c = divmod(d, cols)
        colour = _NODE_COLOURS[(d // devices_per_node) % len(_NODE_COLOURS)]
        cells.append(f"<rect x='{60 + c * cell}' y='{20 + r * cell}' width='{cell - 2}' height='{cell - 2}' fill='{colour}' "
                     f"stroke='#777'/>" + (f"<text x='{62 + c * cell}' y='{34 + r * cell}'>{d}</text>" if cell >= 22 else ""))
    outer = " × ".join(f"{a.name} ({a.parallelism})" for a in plan.mesh[:-1]) or "-"
    last = plan.mesh[-1]
    across, down = f"→ {last.name}: {last.parallelism}, {' + '.join(last.links) or 'no link'}", f"↓ {outer}"
    labels = f"<text x='60' y='13'>{escape(across)}</text><text x='4' y='{30 + rows_n * cell}'>{escape(down)}</text>"
    width = max(70 + cols * cell, 60 + _CHAR_W * len(across), 4 + _CHAR_W * len(down))  # a narrow grid's labels still fit
    svg = (f"<svg width='{width}' height='{40 + rows_n * cell}' role='img' aria-label='device mesh'>"
           f"{labels}{''.join(cells)}</svg>")
    return (f"<h2>Mesh</h2>{table}<p class='muted'>Devices numbered row-major, coloured by node "
            f"({devices_per_node} per node).</p>{svg}")


def _hbar(parts: list[tuple[str, float, str]], total: float, width: int, y: int, label: str, unit: str) -> str:
    x, out = float(_LABEL_W), [f"<text x='0' y='{y + 15}'>{escape(label)}</text>"]
    for name, value, colour in parts:
        w = width * value / total if total else 0
        out.append(f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='20' fill='{colour}'><title>{name}: {value:.3f} {unit}"
                   "</title></rect>")
        x += w
    return "".join(out)


def _step_time(plan: Plan) -> str:
    b = plan.predicted.breakdown
    parts = [(name, getattr(b, field), colour) for name, field, colour in _TIME_PARTS]
    svg = f"<svg width='{_SVG_W}' height='30'>{_hbar(parts, b.total_s, _BAR_W, 4, f'{b.total_s:.3f} s per step', 's')}</svg>"
    rows = "".join(f"<tr><td>{name}</td><td>{value:.3f} s</td><td>{value / b.total_s:.0%}</td></tr>"
                   for name, value, _ in parts if b.total_s)
    comm = "".join(f"<tr><td>{escape(axis)} collectives (overlapped or not)</td><td>{value:.3f} s</td><td></td></tr>"
                   for axis, value in sorted(b.comm_s_by_axis.items()))
    return f"<h2>Step time</h2>{_key(_TIME_PARTS)}{svg}<table>{rows}{comm}</table>"


def _memory(plan: Plan) -> str:
    """Stacked bars per device against the planner's fit limit, usable memory less the runtime reserve (none drawn when the
    part's memory is unknown)."""
    mem = plan.predicted.memory
    limit = None if mem.hbm_bytes is None else (mem.hbm_bytes - mem.reserve_bytes) / _GIB
    bars = [("chosen plan", [(n, getattr(mem, f) / _GIB, c) for n, f, c in _MEMORY_PARTS])]
    bars += [(_layout_name(plan, a.layout), [("total", a.memory_bytes / _GIB, "#9ab")]) for a in plan.alternatives]
    scale = max([limit or 0.0] + [sum(v for _, v, _ in parts) for _, parts in bars]) or 1.0
    width, svg = _BAR_W, []
    for i, (label, parts) in enumerate(bars):
        svg.append(_hbar(parts, scale, width, 6 + 26 * i, label, "GiB"))
        svg.append(f"<text x='{_LABEL_W + 6 + width * sum(v for _, v, _ in parts) / scale:.1f}' y='{21 + 26 * i}'>"
                   f"{sum(v for _, v, _ in parts):.1f} GiB</text>")
    if limit is not None:
        x_limit = _LABEL_W + width * limit / scale
        text = f"fit limit {mem.limit_text()}"
        x_text = min(x_limit + 3, _SVG_W - _CHAR_W * len(text))  # a long label moves left of the line rather than out of the SVG
        svg.append(f"<line x1='{x_limit:.1f}' x2='{x_limit:.1f}' y1='0' y2='{10 + 26 * len(bars)}' stroke='#c00' "
                   f"stroke-dasharray='4 3'/><text x='{x_text:.1f}' y='{22 + 26 * len(bars)}' fill='#c00'>{escape(text)}</text>")
    return (f"<h2>Memory per device</h2>{_key(_MEMORY_PARTS)}"
            f"<svg width='{_SVG_W}' height='{30 + 26 * len(bars)}'>{''.join(svg)}</svg>")


def _pipeline(plan: Plan, events: tuple[TimelineEvent, ...]) -> str:
    lay = plan.layout
    if not events:
        return "<h2>Pipeline</h2><p class='muted'>No timeline given.</p>"
    if len(events) > _MAX_EVENTS:
        events = tuple(e for e in events if e.microbatch < 2 * lay.pp)[:_MAX_EVENTS]
    end_s = max(e.end_s for e in events)
    width, row = 760, 22
    rects = [f"<text x='0' y='{30 + s * row}'>stage {s}</text>" for s in range(lay.pp)]
    for e in events:
        x = 70 + width * e.start_s / end_s
        w = max(0.5, width * (e.end_s - e.start_s) / end_s)
        colour = "#4e79a7" if e.forward else "#59a14f"
        rects.append(f"<rect x='{x:.1f}' y='{16 + e.stage * row}' width='{w:.1f}' height='{row - 4}' fill='{colour}' "
                     f"stroke='#fff' stroke-width='0.5'><title>{'forward' if e.forward else 'backward'} micro-batch "
                     f"{e.microbatch} chunk {e.chunk}</title></rect>")
    return (f"<h2>Pipeline timeline</h2><p class='muted'>{lay.schedule} schedule, {lay.pp} stage(s), interleave "
            f"{lay.interleave}: forward <b style='color:#4e79a7'>blue</b>, backward <b style='color:#59a14f'>green</b>; "
            f"bubble {plan.predicted.breakdown.bubble_s:.3f} s; {end_s:.3f} s drawn.</p>"
            f"<svg width='860' height='{24 + lay.pp * row}'>{''.join(rects)}</svg>")


def _layout_name(plan: Plan, lay: Layout) -> str:
    """A layout in one line: its training terms for a training plan, its degrees alone for a serving one."""
    degrees = lay.degrees_text
    if not plan.train.workload.runs_backward:
        return degrees
    return f"{degrees} v{lay.interleave} mb{lay.micro_batch} {lay.recompute} z{lay.zero_stage}"


def _alternatives(plan: Plan) -> str:
    """The runners-up, timed as the text summary times them: seconds per training step, milliseconds when serving."""
    workload = plan.train.workload
    rows = "".join(f"<tr><td>{_layout_name(plan, a.layout)}</td><td>{_duration(a.step_time_s, training=workload.runs_backward)}"
                   f"</td><td>{a.memory_bytes / _GIB:.1f} GiB</td><td>{escape(a.why)}</td></tr>" for a in plan.alternatives)
    return (f"<h2>Alternatives and why they lost</h2><table><tr><th>layout</th><th>{workload.step_time_label}</th>"
            f"<th>memory</th><th>why not</th></tr>{rows or '<tr><td colspan=4>none costed</td></tr>'}</table>")


def _duration(seconds: float, *, training: bool) -> str:
    return f"{seconds:.3f} s" if training else f"{seconds * 1e3:.2f} ms"
