"""Timed check: a small GPT on 1 device and on 8 emulated devices, predicted vs measured step time.

    python -m benchmarks.validate_timed [--recalibrate] [--steps 3] [--repeats 5]

The ``cpu`` profile of each device count comes only from `validate.cpu_profile`'s
micro-benchmarks (GEMM FLOP/s, a fused layer norm's bandwidth, first touch of fresh
memory, kernel floor, psum ring); nothing is fitted to these rows. Each row runs in its
own process (``--xla_force_host_platform_device_count``): 2 warm-up steps, then
``repeats`` repeats of ``steps`` steps; the table gives the median over repeats, their
spread, the load average after the row and the share of the host's
cores other processes used meanwhile (a row with a large share is not worth reading).

XLA's CPU backend copies every weight gradient's cotangent transposed, with the elementwise
backward that produced it (activation, softmax, norm, loss) fused into the copy's strided
loop; the profile measures that copy with a ReLU's backward fused (``pred_transpose_s`` is
what it adds to a prediction). The checked model is therefore a GPT with a ReLU MLP (as
OPT's); with GELU, as GPT-2's, the fused derivative makes the MLP's copy several times slower
than the ReLU's (~0.15 GB/s), which the profile does not measure: two GELU rows show it.
Pairs of the checked model's rows whose predictions differ by more than 1.5× are checked for
the same measured order. Two rows time the layouts `plan` itself chooses for the ``cpu``
profile on 1 and 8 devices; they and the single-device row are checked within 25 %. Writes
``benchmarks/out/validate_timed.csv``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from benchmarks.output import print_table, write_csv
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner import api
from planner.plan_schema import Plan
from planner.request import PlanRequest
from validate.cpu_profile import CpuMeasurement, cached_measurement, cpu_cluster
from validate.timed import cpu_estimate, time_in_subprocess

CHECKED = ModelConfig(name="gpt-relu", hidden_size=256, num_layers=4, num_heads=8, ffn_size=1024, vocab_size=2048, norm="layernorm",
                      mlp="relu", positions="learned", max_position_embeddings=128, tie_embeddings=True)
GELU = ModelConfig(**{**CHECKED.model_dump(), "name": "gpt-gelu", "mlp": "gelu"})
SEQ_LEN, GLOBAL_BATCH = 128, 8
LAYOUTS = {
    "1 device": Layout(micro_batch=8),
    "dp8": Layout(dp=8, micro_batch=1),
    "dp8 zero1": Layout(dp=8, micro_batch=1, zero_stage=1),
    "dp2 tp4": Layout(dp=2, tp=4, micro_batch=4),
    "tp8": Layout(tp=8, micro_batch=8),
    "dp4 tp2 full recompute": Layout(dp=4, tp=2, micro_batch=2, recompute="full"),
    "tp8 mb1 full recompute": Layout(tp=8, micro_batch=1, recompute="full"),
}
# The planner's own choices (issue 16): `plan --model ... --mesh N --hardware cpu`.
PLANNED = {"planned on 1 device": 1, "planned on 8 devices": 8}
RUNS = [(CHECKED, name) for name in (*LAYOUTS, *PLANNED)] + [(GELU, "1 device"), (GELU, "dp8")]
ORDER_RATIO = 1.5  # predictions this far apart must be measured in the same order
TOLERANCE = 0.25  # of the measured step, for the single-device rows and the planner's own choices


def profile_row(m: CpuMeasurement) -> dict[str, object]:
    """One device count's micro-benchmark numbers, per device."""
    return {"devices": m.n_devices, "gemm_gflops_by_size": " ".join(f"{rate / 1e9:.0f}" for _, rate in m.matmul_flops_per_s),
            "memory_kernel_gb_per_s": m.memory_kernel_bytes_per_s / 1e9,
            "first_touch_gb_per_s": 1e-9 / m.first_touch_s_per_byte if m.first_touch_s_per_byte else float("inf"),
            "transpose_gb_per_s": 1e-9 / m.transpose_s_per_byte if m.transpose_s_per_byte else float("inf"),
            "relu_transpose_gb_per_s": 1e-9 / m.fused_transpose_s_per_byte if m.fused_transpose_s_per_byte else float("inf"),
            "kernel_floor_us": m.kernel_floor_s * 1e6,
            "link_gb_per_s": m.link_bytes_per_s / 1e9, "link_latency_us": m.link_latency_s * 1e6,
            "load_avg": m.load_average, "other_cpu_share": m.other_cpu_share}


def chosen_plan(model: ModelConfig, name: str) -> Plan:
    """A hand-picked layout of `LAYOUTS`, or for ``planned on N devices`` the layout `plan`
    itself chooses for the ``cpu`` profile on a mesh of N devices, as a user would ask for it."""
    mesh = None if name in LAYOUTS else str(PLANNED[name])
    request = PlanRequest(model=model, mesh=mesh, hardware="cpu", seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH)
    return api.layout_plan(request, LAYOUTS[name]) if name in LAYOUTS else api.plan(request)


def timed_row(model: ModelConfig, name: str, measured: CpuMeasurement, *, steps: int, repeats: int) -> dict[str, object]:
    """Predict, then time, one layout of ``model``."""
    plan = chosen_plan(model, name)
    cluster = cpu_cluster(measured)
    estimate = cpu_estimate(plan, cluster)
    no_transpose = cluster.model_copy(update={"device": cluster.device.model_copy(update={"gradient_transpose": None})})
    b = estimate.breakdown
    run = time_in_subprocess(plan, steps=steps, repeats=repeats)
    lay = plan.layout
    chosen = f" (dp{lay.dp} tp{lay.tp} mb{lay.micro_batch} {lay.recompute.value} z{lay.zero_stage})" if name in PLANNED else ""
    return {"model": model.name, "layout": name + chosen, "devices": run.n_devices, "predicted_s": estimate.step_time_s,
            "measured_s": run.median_step_s, "ratio": run.median_step_s / estimate.step_time_s, "spread": run.spread,
            "pred_compute_s": b.compute_s + b.recompute_s, "pred_memory_s": b.memory_bound_s, "pred_comm_s": b.exposed_comm_s,
            "pred_optimizer_s": b.optimizer_s, "pred_first_touch_s": b.first_touch_s,
            "pred_transpose_s": estimate.step_time_s - cpu_estimate(plan, no_transpose).step_time_s, "load_avg": run.load_average[1],
            "other_cpu_share": run.other_cpu_share}


def order_checks(rows: list[dict[str, object]]) -> list[str]:
    """A verdict line for each pair of the checked model's rows predicted more than 1.5× apart."""
    lines = []
    for a, b in itertools.combinations([r for r in rows if r["model"] == CHECKED.name], 2):
        pa, pb, ma, mb = (float(r[k]) for k in ("predicted_s", "measured_s") for r in (a, b))
        if max(pa, pb) > ORDER_RATIO * min(pa, pb):
            verdict = "agrees" if (pa < pb) == (ma < mb) else "DISAGREES"
            lines.append(f"{a['layout']} vs {b['layout']}: predicted {pa:.3f} / {pb:.3f} s, measured {ma:.3f} / {mb:.3f} s: "
                         f"order {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recalibrate", action="store_true", help="re-run the CPU micro-benchmarks instead of using the cache")
    parser.add_argument("--steps", type=int, default=3, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per layout")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/validate_timed.csv"), help="where to write the CSV")
    args = parser.parse_args(argv)
    counts = {lay.n_devices for lay in LAYOUTS.values()} | set(PLANNED.values())
    profiles = {n: cached_measurement(n, recalibrate=args.recalibrate) for n in sorted(counts)}
    print_table("cpu profile per emulated device (micro-benchmarks; GEMM GFLOP/s at 128, 256, 512, 1024)",
                [profile_row(m) for m in profiles.values()])
    rows = []
    for model, name in RUNS:
        devices = LAYOUTS[name].n_devices if name in LAYOUTS else PLANNED[name]
        rows.append(timed_row(model, name, profiles[devices], steps=args.steps, repeats=args.repeats))
        print(f"{model.name} {name}: predicted {rows[-1]['predicted_s']:.3f} s, measured {rows[-1]['measured_s']:.3f} s", flush=True)
    print_table(f"{CHECKED.name} (and {GELU.name}), seq {SEQ_LEN}, batch {GLOBAL_BATCH}: predicted vs measured step time", rows)
    checked = [r for r in rows if r["model"] == CHECKED.name and (r["devices"] == 1 or str(r["layout"]).startswith("planned"))]
    for row in checked:
        within = abs(float(row["predicted_s"]) - float(row["measured_s"])) <= TOLERANCE * float(row["measured_s"])
        print(f"{row['layout']}: measured / predicted = {float(row['ratio']):.2f}: {'within' if within else 'NOT within'} 25 %")
    print("\n".join(order_checks(rows)) or "no pair of layouts is predicted more than 1.5x apart")
    write_csv(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
