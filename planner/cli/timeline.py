"""Pipeline timeline as a PNG: one row per stage, forward and backward micro-steps.

Used by ``plan simulate --timeline FILE`` on an estimate made with
``simulate(..., keep_timeline=True)``.
"""

from __future__ import annotations

from pathlib import Path

from costmodel.errors import InvalidConfigError
from costmodel.step.estimate import StepEstimate

# Enough boxes to read a schedule; beyond this the plot is a blur and slow to draw.
_MAX_EVENTS = 20_000


def write_timeline(estimate: StepEstimate, path: str | Path) -> Path:
    """Draw ``estimate.timeline`` (forward blue, backward green) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = estimate.timeline
    if not events:
        raise InvalidConfigError("the estimate has no timeline", fix="simulate with keep_timeline=True")
    if len(events) > _MAX_EVENTS:
        events = tuple(e for e in events if e.microbatch < 2 * max(1, estimate.layout.pp)) or events[:_MAX_EVENTS]
    n_stages = estimate.layout.pp
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * n_stages))
    for colour, forward in (("tab:blue", True), ("tab:green", False)):
        for stage in range(n_stages):
            spans = [(e.start_s, e.end_s - e.start_s) for e in events if e.forward == forward and e.stage == stage]
            ax.broken_barh(spans, (stage - 0.4, 0.8), facecolors=colour, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(n_stages), [f"stage {s}" for s in range(n_stages)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    lay = estimate.layout
    ax.set_title(f"{lay.schedule} pp={lay.pp} interleave={lay.interleave}: forward (blue), backward (green); "
                 f"bubble {estimate.breakdown.bubble_s:.2f} s of {estimate.step_time_s:.2f} s")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
