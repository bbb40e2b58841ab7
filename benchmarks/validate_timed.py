"""Timed validation: a small GPT on 1 device and 8 emulated devices, predicted vs measured step time.

    python -m benchmarks.validate_timed [--recalibrate]

The ``cpu`` profile comes only from `validate.cpu_profile`'s micro-benchmarks (matmul
FLOP/s, streaming bandwidth, kernel floor); nothing is fitted to these rows. Each layout
runs in its own process (``--xla_force_host_platform_device_count``), 5 blocks of 3 steps
after 2 warm-up steps; the table gives the median block and the spread. Pairs of layouts
whose predictions differ by more than 1.5× are checked for the same measured order.
Writes ``benchmarks/out/validate_timed.csv``.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from benchmarks.output import print_table, write_csv
from costmodel.layout import Layout
from costmodel.model_config import ModelConfig
from planner.api import layout_plan
from validate.cpu_profile import cached_measurement
from validate.timed import predicted_cpu_step_s, time_in_subprocess

GPT = ModelConfig(name="gpt-small", hidden_size=256, num_layers=4, num_heads=8, ffn_size=1024, vocab_size=2048, norm="layernorm",
                  mlp="gelu", positions="learned", max_position_embeddings=256, tie_embeddings=True)
LAYOUTS = {
    "1 device": Layout(micro_batch=8),
    "dp8": Layout(dp=8, micro_batch=1),
    "dp2 tp4": Layout(dp=2, tp=4, micro_batch=4),
    "tp8": Layout(tp=8, micro_batch=8),
    "dp4 tp2 full recompute": Layout(dp=4, tp=2, micro_batch=2, recompute="full"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recalibrate", action="store_true", help="re-run the CPU micro-benchmarks instead of using the cache")
    args = parser.parse_args()
    measured = cached_measurement(recalibrate=args.recalibrate)
    rows = []
    for name, layout in LAYOUTS.items():
        plan = layout_plan(GPT, layout, hardware="cpu", seq_len=256, global_batch=8)
        predicted = predicted_cpu_step_s(plan, measured)
        run = time_in_subprocess(plan)
        rows.append({"layout": name, "devices": layout.n_devices, "predicted_s": predicted, "measured_s": run.median_step_s,
                     "ratio": run.median_step_s / predicted, "spread": run.spread, "load_avg": run.load_average})
    print_table("small GPT, predicted vs measured step time (cpu profile from micro-benchmarks)", rows)
    for a, b in itertools.combinations(rows, 2):
        if max(a["predicted_s"], b["predicted_s"]) > 1.5 * min(a["predicted_s"], b["predicted_s"]):
            agrees = (a["predicted_s"] < b["predicted_s"]) == (a["measured_s"] < b["measured_s"])
            print(f"{a['layout']} vs {b['layout']}: predicted {a['predicted_s']:.3f} / {b['predicted_s']:.3f} s, "
                  f"measured {a['measured_s']:.3f} / {b['measured_s']:.3f} s: order {'agrees' if agrees else 'DISAGREES'}")
    write_csv(Path("benchmarks/out/validate_timed.csv"), rows)


if __name__ == "__main__":
    main()
