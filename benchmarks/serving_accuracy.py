"""Serving-model accuracy against published inference measurements.

Every row of ``benchmarks/data/inference_runs.csv`` is predicted from its own columns alone
(model preset, hardware, tp / pp / replicas, batch, input and output lengths, precision,
weight and KV-cache storage; fp8 rows: fp8 weights with the GEMMs in fp8, W8A8) with the
function ``plan --workload decode`` and ``plan simulate --workload decode`` call,
`costmodel.step.inference.simulate_inference`. One call gives the time per output token (TPOT) at
the row's mean decode context (``input + output // 2``: the steps of a generation see every
context from the prompt to its end), the time to first token (TTFT, the prompts prefilled) and
the HBM floor of a decode step (every weight and cache byte read once at the datasheet
bandwidth). Each row's metric is then predicted as the source measured it:

- ``output_tokens_per_s`` (and ``_per_device``): a static batch, ``replicas · batch ·
  output / (TTFT + (output − 1) · TPOT)``: the prefill gives the first token, each decode
  step one more (TensorRT-LLM's gptSessionBenchmark, gpt-fast's ``generate.py``);
- ``decode_tokens_per_s``: one sequence's decode rate, ``1 / TPOT``;
- ``tpot_s`` and ``ttft_s``: as predicted.

A row the serving model cannot express (unstated lengths, a model without a preset) is listed
as skipped with why. Prints the table (measured, predicted, the HBM bound in the metric's own
unit, error), the mean, signed and max error per source, per serving stack and per metric, and
the decode must-show (llama3-8b and llama3-70b at batch 1 and 64 on H100 and A100: HBM floor,
predicted, published where a row matches); writes one CSV. Exits 1 if any predicted TPOT is below
its HBM floor.

    python -m benchmarks.serving_accuracy [--data PATH] [--out benchmarks/out/serving_accuracy.csv]

The rows' ``serving_stack`` column names the software that served them
(`costmodel.inputs.serving_stack`); an eager stack's per-operator host cost is the one constant
fitted to these rows, and each source's rows are predicted with it fitted on the other sources'
(`leave_one_source_out_host`). Otherwise the only constants are the hardware profiles'.

Rows measured under load (``benchmarks/data/serving_load_runs.csv``) are simulated with continuous
batching (`costmodel.step.continuous_batching`) at their load: clients in a closed loop, a Poisson
rate, or all requests at once (`serve_config`), at fixed lengths (the rows' means); a row without
lengths or a layout is skipped with why (`load_skip_reason`). Each MLPerf server run is also put to
``plan serve`` (`mlperf_capacity`): the layout it chooses and its capacity within MLPerf's targets,
against the rate the submission sustained.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.output import print_table, write_csv
from benchmarks.simulator_accuracy import error_summary
from costmodel.errors import PlannerError
from costmodel.hardware.machine import train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout
from costmodel.inputs.serving_stack import get_serving_stack
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.inputs.workload import InferenceConfig
from costmodel.step.continuous_batching import LengthDistribution, ServeConfig, simulate_serving
from costmodel.step.estimate import StepEstimate
from costmodel.step.inference import simulate_inference
from planner.config import load_model, train_config
from planner.presets import PRESETS
from search.serve_capacity import BATCH_LIMITS, Slo, serve_options

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "inference_runs.csv"
LOAD_DATA = Path(__file__).resolve().parent / "data" / "serving_load_runs.csv"
# The per-operator host costs an eager stack's fit may choose (1-60 µs).
HOST_S_PER_OP_GRID = tuple(i * 1e-6 for i in range(1, 61))
# Units the sources quote, to the seconds and tokens/s the predictions are in.
UNIT_SCALE = {"ms": 1e-3, "tokens/s": 1.0, "tokens/s/GPU": 1.0, "tokens/s per sequence": 1.0}
THROUGHPUT_METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_device", "decode_tokens_per_s")
# fp8 serving computes in bf16 around fp8 GEMMs: the fp8 is the weights' storage (`TrainConfig.serves_fp8`).
COMPUTE_PRECISIONS = {"bf16": Precision.BF16, "fp16": Precision.FP16, "fp8": Precision.BF16}
WEIGHT_DTYPES = {"bf16": "bf16", "fp16": "bf16", "int8": "int8", "int4": "int4", "fp8": "fp8"}  # fp16 weights: 2 bytes, as bf16
MUST_SHOW = (("llama3-8b", "h100-sxm", 1), ("llama3-8b", "a100-80gb", 1), ("llama3-8b", "a100-40gb", 1),
             ("llama3-70b", "h100-sxm", 4), ("llama3-70b", "a100-80gb", 4), ("llama3-70b", "a100-80gb", 8))
MUST_SHOW_BATCHES = (1, 16, 64)
MUST_SHOW_LENGTHS = (1024, 128)  # input, output tokens


def skip_reason(row: dict[str, str]) -> str | None:
    """Why the serving model cannot predict ``row`` from its columns, or None.

    >>> skip_reason({"precision": "fp8", "weight_dtype": "fp8", "preset": "llama2-7b", "input_len": "", "output_len": "1"})
    'input and output lengths not published'
    """
    if row["precision"] not in COMPUTE_PRECISIONS or row["weight_dtype"] not in WEIGHT_DTYPES:
        return f"{row['precision']} compute with {row['weight_dtype']} weights is not modelled"
    if not row["input_len"] or not row["output_len"]:
        return "input and output lengths not published"
    if row["preset"] not in PRESETS:
        return f"no preset for {row['model']}"
    return None


def serving_estimate(*, preset: str, hardware: str, tp: int, pp: int = 1, replicas: int = 1, batch: int, input_len: int,
                     output_len: int, precision: str = "bf16", weight_dtype: str = "bf16", kv_cache_dtype: str = "auto",
                     serving_stack: str = "jax", host_s_per_op: float | None = None, weight_kernel: str = "fused",
                     weight_group_size: int = 128) -> StepEstimate:
    """The serving model's estimate for one configuration, as ``plan simulate --workload decode`` builds it
    (``host_s_per_op``: the stack's per-operator host cost in place of its preset's).

    >>> est = serving_estimate(preset="llama3-8b", hardware="h100-sxm", tp=1, batch=1, input_len=1024, output_len=128)
    >>> est.time_per_output_token_s >= est.serving.hbm_lower_bound_s
    True
    """
    inference = InferenceConfig(prompt_len=input_len, weight_dtype=WEIGHT_DTYPES[weight_dtype], kv_cache_dtype=kv_cache_dtype,
                                serving_stack=serving_stack, host_s_per_op=host_s_per_op, weight_kernel=weight_kernel,
                                weight_group_size=weight_group_size)
    train: TrainConfig = train_config(workload="decode", global_batch=batch, seq_len=input_len + output_len // 2, lora=None,
                                      inference=inference).with_precision(COMPUTE_PRECISIONS[precision])
    machine = train_machine(load_hardware(hardware), train)
    return simulate_inference(load_model(preset), train, Layout(dp=replicas, tp=tp, pp=pp), machine)


def predicted_metric(row: dict[str, str], est: StepEstimate) -> tuple[float, float | None]:
    """(prediction, HBM bound) of ``row``'s metric, in its own unit: the bound is what the metric
    would be with every decode step at the HBM floor and a free prefill (None for TTFT)."""
    tpot_s, ttft_s, floor_s = est.time_per_output_token_s, est.time_to_first_token_s, est.serving.hbm_lower_bound_s
    batch, out = int(row["batch"]) * int(row["replicas"]), int(row["output_len"])
    metric = row["metric"]
    if metric in ("output_tokens_per_s", "output_tokens_per_s_per_device"):
        per = est.n_devices if metric.endswith("per_device") else 1
        bound = batch * out / ((out - 1) * floor_s) / per if out > 1 else None
        return batch * out / (ttft_s + (out - 1) * tpot_s) / per, bound
    if metric == "decode_tokens_per_s":
        return 1 / tpot_s, 1 / floor_s
    if metric == "tpot_s":
        return tpot_s, floor_s
    if metric == "ttft_s":
        return ttft_s, None
    raise ValueError(f"unknown metric {metric!r} in {row['source']}")


def evaluate(rows: list[dict[str, str]], *, host_s_per_op: dict[str, float] | None = None) -> list[dict[str, object]]:
    """One result per row: the prediction and its error, or the reason it was skipped. A row's
    ``serving_stack`` column names its stack (blank: jax), ``weight_kernel`` its int4 GEMM kernel (blank: fused) and
    ``weight_group_size`` its int4 group (blank: 128); ``host_s_per_op`` replaces the stack's per-operator host cost
    for the rows of the sources it names (`leave_one_source_out_host`)."""
    results = []
    for row in rows:
        measured = float(row["measured_value"]) * UNIT_SCALE[row["measured_unit"]]
        result: dict[str, object] = {
            "source": source_family(row), "stack": row_stack(row), "model": row["model"], "hardware": row["hardware"],
            "layout": f"tp{row['tp']} pp{row['pp']} x{row['replicas']}", "batch": int(row["batch"]),
            "in_out": f"{row['input_len'] or '?'}/{row['output_len'] or '?'}", "weights": row["weight_dtype"], "kv": row["kv_cache_dtype"],
            "metric": row["metric"],
            "measured": measured, "predicted": None, "hbm_bound": None, "error_pct": None, "tpot_ms": None, "hbm_floor_ms": None,
            "fits": None, "skipped": skip_reason(row) or "",
        }
        if not result["skipped"]:
            try:
                est = serving_estimate(preset=row["preset"], hardware=row["hardware"], tp=int(row["tp"]), pp=int(row["pp"]),
                                       replicas=int(row["replicas"]), batch=int(row["batch"]), input_len=int(row["input_len"]),
                                       output_len=int(row["output_len"]), precision=row["precision"], weight_dtype=row["weight_dtype"],
                                       kv_cache_dtype=row["kv_cache_dtype"] or "auto", serving_stack=row_stack(row),
                                       host_s_per_op=(host_s_per_op or {}).get(source_family(row)),
                                       weight_kernel=row.get("weight_kernel") or "fused",
                                       weight_group_size=int(row.get("weight_group_size") or 128))
            except PlannerError as err:
                result["skipped"] = str(err).split(";")[0]
            else:
                predicted, bound = predicted_metric(row, est)
                result.update(predicted=predicted, hbm_bound=bound, error_pct=100 * (predicted - measured) / measured,
                              tpot_ms=1e3 * est.time_per_output_token_s, hbm_floor_ms=1e3 * est.serving.hbm_lower_bound_s,
                              fits=est.fits)
        results.append(result)
    return results


def source_family(row: dict[str, str]) -> str:
    """The repository or publication a row comes from.

    >>> source_family({"source": "pytorch-labs/gpt-fast README.md (@0f925b5d)"})
    'pytorch-labs/gpt-fast'
    >>> source_family({"source": "John Musgrave, vLLM sweep (https://example.org/p)"})
    'John Musgrave'
    """
    return row["source"].split(",")[0].split(" ")[0] if "/" in row["source"].split(" ")[0] else row["source"].split(",")[0]


# Metrics of rows measured under load (`benchmarks/data/serving_load_runs.csv`) → the simulated
# result's field and the unit scale of the row's value. NIM's TTFT and inter-token latency do not
# say mean or median: read as medians.
LOAD_METRICS = {"ttft_s": "ttft_p50_s", "ttft_p50_s": "ttft_p50_s", "ttft_p99_s": "ttft_p99_s", "itl_s": "tpot_p50_s",
                "tpot_p50_s": "tpot_p50_s", "tpot_p99_s": "tpot_p99_s", "e2e_latency_p50_s": "latency_p50_s",
                "output_tokens_per_s": "output_tokens_per_s", "throughput_req_per_s": "requests_per_s"}
LOAD_UNITS = {"ms": 1e-3, "ns": 1e-9, "s": 1.0, "tokens/s": 1.0, "req/s": 1.0}
# What the issue asks of the rows under load: median latencies and throughput (tails are reported beside them).
LOAD_MEDIANS_AND_THROUGHPUT = ("ttft_s", "ttft_p50_s", "itl_s", "tpot_p50_s", "e2e_latency_p50_s", "output_tokens_per_s",
                               "throughput_req_per_s")
LOAD_TOLERANCE_PCT = 20.0


def load_skip_reason(row: dict[str, str]) -> str | None:
    """Why a row measured under load cannot be simulated from its columns, or None."""
    if row["metric"] not in LOAD_METRICS or row["measured_unit"] not in LOAD_UNITS:
        return f"metric {row['metric']} in {row['measured_unit']} is not simulated"
    if not row["input_len"] or not row["output_len"] or not row["tp"] or not row["replicas"]:
        return "lengths or layout not published"
    if row["preset"] not in PRESETS or row["precision"] not in COMPUTE_PRECISIONS or row["weight_dtype"] not in WEIGHT_DTYPES:
        return f"no preset or precision for {row['model']}"
    if not row["concurrency"] and row["request_rate_per_s"] == "inf" and not (row["requests"] or row["batch"]):
        return "all requests at once without a stated count"
    return None


def serve_config(row: dict[str, str]) -> ServeConfig:
    """The load a row was measured under: its clients in a closed loop, its Poisson rate (its
    ``requests`` where stated, else 500), or (rate ``inf``) its ``requests`` all arriving at once;
    at most its ``batch`` running together on a replica (the server's slots) where stated; fixed
    lengths at the row's (mean) lengths; its iteration's token budget where stated."""
    common = {"input_len": LengthDistribution(fixed=int(row["input_len"])), "output_len": LengthDistribution(fixed=int(row["output_len"]))}
    if row["prefill_chunk_tokens"]:
        common["prefill_chunk_tokens"] = int(row["prefill_chunk_tokens"])
    if row["batch"]:
        common["max_batch"] = int(row["batch"])
    if row["concurrency"]:
        clients = int(row["concurrency"])
        return ServeConfig(concurrency=clients, requests=max(3 * clients, 60), **common)
    if row["request_rate_per_s"] == "inf":
        requests = int(row["requests"] or row["batch"])
        return ServeConfig(arrivals_s=(0.0,) * requests, requests=requests, **common)
    return ServeConfig(rate_per_s=float(row["request_rate_per_s"]), requests=int(row["requests"] or 500), **common)


def row_stack(row: dict[str, str]) -> str:
    """The serving stack a row names (blank: jax)."""
    return row.get("serving_stack") or "jax"


def load_train(row: dict[str, str]) -> TrainConfig:
    """The decode workload a row measured under load served: its weight and KV-cache storage, its compute precision, its
    serving stack (`row_stack`)."""
    inference = InferenceConfig(weight_dtype=WEIGHT_DTYPES[row["weight_dtype"]], kv_cache_dtype=row["kv_cache_dtype"] or "auto",
                                serving_stack=row_stack(row))
    return train_config(workload="decode", lora=None, inference=inference).with_precision(COMPUTE_PRECISIONS[row["precision"]])


def evaluate_load(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """One result per row measured under load: continuous batching simulated at the row's load
    (`costmodel.step.continuous_batching`), or the reason it was skipped."""
    results, runs = [], {}
    for row in rows:
        measured = float(row["measured_value"]) * LOAD_UNITS.get(row["measured_unit"], math.nan)
        result = {"source": source_family(row), "stack": row_stack(row), "model": row["model"],
                  "hardware": row["hardware"], "layout": f"tp{row['tp'] or '?'} x{row['replicas'] or '?'}",
                  "load": f"{row['concurrency']} clients" if row["concurrency"] else f"{row['request_rate_per_s']} req/s",
                  "in_out": f"{row['input_len'] or '?'}/{row['output_len'] or '?'}", "metric": row["metric"], "measured": measured,
                  "predicted": None, "error_pct": None, "overloaded": None, "skipped": load_skip_reason(row) or ""}
        if not result["skipped"]:
            train = load_train(row)
            layout, load = Layout(dp=int(row["replicas"]), tp=int(row["tp"])), serve_config(row)
            key = (row["preset"], row["hardware"], train.model_dump_json(), layout.model_dump_json(), load.model_dump_json())
            try:
                if key not in runs:  # a run's metrics are rows of their own: simulated once
                    runs[key] = simulate_serving(load_model(row["preset"]), train, layout,
                                                 train_machine(load_hardware(row["hardware"]), train), load)
                served = runs[key]
            except PlannerError as err:
                result["skipped"] = str(err).split(";")[0]
            else:
                predicted = float(getattr(served, LOAD_METRICS[row["metric"]]))
                result.update(predicted=predicted, error_pct=100 * (predicted - measured) / measured, overloaded=served.queue_growing)
        results.append(result)
    return results


# MLPerf Inference's llama2-70b server constraints (each row's notes quote its log: 'ttft_latency (ns): 2000000000',
# 'tpot_latency (ns): 200000000'), both on the 99th percentile.
MLPERF_LLAMA2_SLO = Slo(ttft_s=2.0, tpot_s=0.2)


def mlperf_capacity(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """``plan serve`` on each MLPerf server run of ``rows`` whose system states its precision: its devices, rate,
    mean lengths, engine batch limit (where stated) and MLPerf's targets given, the layout it chooses (tensor-parallel
    degree and replicas) and its capacity within the targets, against the rate the submission sustained and its own
    layout. The sustained rate is a lower bound on the system's capacity (a submitter runs near it, not at it)."""
    out = []
    for row in rows:
        if not (row["source"].startswith("mlcommons/") and row["metric"] == "throughput_req_per_s" and row["request_rate_per_s"] != "inf"
                and row["input_len"] and row["precision"] in COMPUTE_PRECISIONS and row["weight_dtype"] in WEIGHT_DTYPES):
            continue
        train = load_train(row)
        cfg = ServeConfig(rate_per_s=float(row["request_rate_per_s"]), input_len=LengthDistribution(fixed=int(row["input_len"])),
                          output_len=LengthDistribution(fixed=int(row["output_len"])))
        best = serve_options(load_model(row["preset"]), train, train_machine(load_hardware(row["hardware"]), train),
                             n_devices=int(row["devices"]), cfg=cfg, slo=MLPERF_LLAMA2_SLO,
                             batch_limits=(int(row["batch"]),) if row["batch"] else BATCH_LIMITS)[0]
        measured = float(row["measured_value"])
        out.append({"source": source_family(row), "hardware": row["hardware"], "devices": int(row["devices"]),
                    "published": f"tp{row['tp']} x{row['replicas']}", "chosen": f"tp{best.layout.tp} x{best.layout.dp}",
                    "batch": best.max_batch, "sustained_req_per_s": measured, "capacity_req_per_s": best.capacity_per_s,
                    "error_pct": 100 * (best.capacity_per_s - measured) / measured})
    return out


def _host_bound_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Rows served by a stack that dispatches operators from the host (its per-operator cost is fitted)."""
    return [r for r in rows if r.get("serving_stack") and get_serving_stack(r["serving_stack"]).host_ops_per_layer
            and skip_reason(r) is None]


def fit_host_s_per_op(rows: list[dict[str, str]]) -> float | None:
    """The per-operator host cost (`HOST_S_PER_OP_GRID`) with the least mean |error| over ``rows`` of
    host-dispatching stacks; None without such rows."""
    rows = _host_bound_rows(rows)
    if not rows:
        return None

    def mean_error(value: float) -> float:
        sources = {source_family(r): value for r in rows}
        return statistics.mean(abs(float(r["error_pct"])) for r in evaluate(rows, host_s_per_op=sources))

    return min(HOST_S_PER_OP_GRID, key=mean_error)


def leave_one_source_out_host(rows: list[dict[str, str]]) -> dict[str, float]:
    """Source → the per-operator host cost fitted on the other sources' host-dispatching rows
    (a source with no other source to learn from keeps its stack's preset)."""
    bound = _host_bound_rows(rows)
    fitted = {}
    for family in sorted({source_family(r) for r in bound}):
        value = fit_host_s_per_op([r for r in bound if source_family(r) != family])
        if value is not None:
            fitted[family] = value
    return fitted


def floor_violations(results: list[dict[str, object]]) -> list[dict[str, object]]:
    """Predicted rows whose time per output token is below the HBM floor (none, if the model is sound)."""
    return [r for r in results if r["tpot_ms"] is not None and float(r["tpot_ms"]) < float(r["hbm_floor_ms"]) * (1 - 1e-9)]


def must_show(results: list[dict[str, object]], rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """Decode per-token latency of llama3-8b and llama3-70b at batch 1, 16 and 64 (1024 input, 128
    output tokens): HBM floor, prediction, and the published per-token latency of a row with the
    same preset, hardware, tp and batch (any lengths), if one exists."""
    published = {}
    for row, result in zip(rows, results):
        if row["metric"] in ("tpot_s", "decode_tokens_per_s") and row["replicas"] == "1":
            value = float(result["measured"])
            published[row["preset"], row["hardware"], int(row["tp"]), int(row["batch"])] = (
                f"{1e3 * (value if row['metric'] == 'tpot_s' else 1 / value):.2f} ({row['framework']})")
    out = []
    for preset, hardware, tp in MUST_SHOW:
        for batch in MUST_SHOW_BATCHES:
            est = serving_estimate(preset=preset, hardware=hardware, tp=tp, batch=batch, input_len=MUST_SHOW_LENGTHS[0],
                                   output_len=MUST_SHOW_LENGTHS[1])
            out.append({"model": preset, "hardware": hardware, "tp": tp, "batch": batch,
                        "hbm_floor_ms": 1e3 * est.serving.hbm_lower_bound_s, "predicted_tpot_ms": 1e3 * est.time_per_output_token_s,
                        "published_tpot_ms": published.get((preset, hardware, tp, batch), "-"), "fits": est.fits})
    return out


def _fmt(results: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: ("-" if v is None else v) for k, v in r.items()} for r in results]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="published inference measurements CSV")
    parser.add_argument("--load", type=Path, default=LOAD_DATA, help="published measurements under load CSV")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/serving_accuracy.csv"), help="where to write the CSV")
    args = parser.parse_args(argv)
    with args.data.open() as f:
        rows = list(csv.DictReader(f))
    everyone = fit_host_s_per_op(rows)
    held_out = leave_one_source_out_host(rows)
    for family, value in held_out.items():
        print(f"host seconds per operator for {family}, fitted on the other sources' eager rows: {value * 1e6:.0f} µs "
              f"(on all of them: {everyone * 1e6:.0f} µs)")
    results = evaluate(rows, host_s_per_op=held_out)
    predicted = [r for r in results if not r["skipped"]]
    print_table(f"Serving model vs published inference measurements ({len(predicted)} predicted, "
                f"{len(results) - len(predicted)} skipped)", _fmt([{k: v for k, v in r.items() if k != "skipped"} for r in predicted]))
    print_table("Skipped rows", [{"source": r["source"], "model": r["model"], "hardware": r["hardware"], "metric": r["metric"],
                                  "why": r["skipped"]} for r in results if r["skipped"]])
    errors = [abs(float(r["error_pct"])) for r in predicted]
    print(f"mean |error| {statistics.mean(errors):.1f} %   max |error| {max(errors):.1f} %   over {len(errors)} rows")
    for key in ("source", "stack", "metric"):
        print_table(f"|error| per {key}", error_summary(predicted, key))
    print_table("Decode must-show: time per output token, 1024 input / 128 output tokens", must_show(results, rows))
    write_csv(args.out, results)
    print(f"wrote {args.out}")
    with args.load.open() as f:
        load_rows = list(csv.DictReader(f))
    load = evaluate_load(load_rows)
    simulated = [r for r in load if not r["skipped"]]
    print_table(f"Under load: continuous batching simulated ({len(simulated)} rows, {len(load) - len(simulated)} skipped)",
                _fmt([{k: v for k, v in r.items() if k != "skipped"} for r in simulated]))
    skipped = defaultdict(int)
    for r in load:
        if r["skipped"]:
            skipped[r["source"], r["skipped"]] += 1
    print_table("Under load: skipped rows", [{"source": k[0], "why": k[1], "rows": n} for k, n in sorted(skipped.items())])
    for key in ("source", "stack", "metric"):
        print_table(f"Under load: |error| per {key}", error_summary(simulated, key))
    write_csv(args.out.with_name(args.out.stem + "_load.csv"), load)
    print_table("plan serve under MLPerf's targets (TTFT p99 <= 2 s, TPOT p99 <= 200 ms): its layout and capacity "
                "against the rate each submission sustained", mlperf_capacity(load_rows))
    core = [r for r in simulated if r["metric"] in LOAD_MEDIANS_AND_THROUGHPUT]
    within = sum(abs(float(r["error_pct"])) <= LOAD_TOLERANCE_PCT for r in core)
    print(f"under load, median latencies and throughput: {within} of {len(core)} rows within {LOAD_TOLERANCE_PCT:.0f} %, "
          f"mean |error| {statistics.mean(abs(float(r['error_pct'])) for r in core):.1f} % "
          f"({sum(bool(r['overloaded']) for r in simulated)} simulated rows overloaded: their queue grows through the run)")
    every = [abs(float(r["error_pct"])) for r in (*predicted, *core)]
    sources = {r["source"] for r in (*predicted, *core)}
    print(f"all rows, static and under load (medians and throughput): mean |error| {statistics.mean(every):.1f} %   over "
          f"{len(every)} rows from {len(sources)} sources")
    below = floor_violations(results)
    print(f"predicted TPOT below the HBM floor: {len(below)} rows")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
