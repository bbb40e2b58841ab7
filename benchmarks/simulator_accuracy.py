"""Simulator accuracy against published training runs.

Every row of ``../shared/data/published_training_runs.csv`` is simulated from its own
configuration (model shape, devices, hardware, layout, attention kernel, overlap) and the
predicted step time is compared with the one the source measured. Prints a table and
writes a CSV. It also times ``plan simulate`` end to end (a fresh process, imports
included) on the largest layout, GPT-1T on 3072 devices, against a 1 s budget, and exits 1
past it.

    python -m benchmarks.simulator_accuracy [--data PATH] [--out benchmarks/out/simulator_accuracy.csv]

Rules for cells the source leaves blank: micro-batch 1, no interleaving (1F1B), cp 1.
torchtitan's "selective" is its own activation checkpointing: per layer where the row's
notes say "layer-level SAC", otherwise per op (its default in the configs these runs used).
Facts of each source's software stack, from its code at the time of the runs:

- Elementwise kernels are fused for Megatron-LM (its fused kernels) and for torchtitan runs
  whose notes say torch.compile; other torchtitan runs are eager (its default then).
- Megatron-LM recomputes a layer's whole forward (its reentrant checkpointing); torchtitan's
  non-reentrant checkpointing stops at the last tensor backward needs.
- Megatron-LM keeps activations [seq, batch, hidden]; torchtitan [batch, seq, hidden], so its
  sequence-parallel collectives copy their buffers.
- Korthikanti et al. (2022) ran Megatron-LM's asynchronous tensor-parallel communication
  (backward collectives behind the gradient GEMMs); Narayanan et al.'s runs (early 2021)
  predate it, and torchtitan's runs here are its "vanilla" (not async) tensor parallelism.
- torchtitan shards with FSDP2, which copies every gathered parameter out of the
  all-gather buffer on the compute stream (``FSDPParamGroup.wait_for_unshard``).

Nothing here is tuned per row: the only constants are the hardware profiles'.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.output import print_table, write_csv
from costmodel.layout import Layout, Recompute, Schedule
from costmodel.machine import load_machine
from costmodel.model_config import ModelConfig
from costmodel.simulator import simulate
from costmodel.train_config import TrainConfig

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "published_training_runs.csv"
# Narayanan et al.'s largest run: a 1T-parameter GPT on 3072 A100s, tp8 pp64 dp6.
PLAN_SIMULATE_1T = ("simulate", "--model", "megatron-gpt-1008b", "--hardware", "a100-80gb", "--devices", "3072", "--tp", "8",
                    "--pp", "64", "--global-batch", "3072", "--recompute", "full", "--reentrant-recompute", "--attention", "materialized",
                    "--dp-overlap", "no", "--json")
PLAN_SIMULATE_BUDGET_S = 1.0


def model_from_row(row: dict[str, str]) -> ModelConfig:
    """The model a row trained, from its own columns."""
    gpt = row["arch"] == "gpt"
    return ModelConfig(
        name=row["model"], hidden_size=int(row["hidden"]), num_layers=int(row["layers"]), num_heads=int(row["heads"]),
        num_kv_heads=int(row["kv_heads"]), head_dim=int(row["head_dim"]) if row["head_dim"] else None,
        ffn_size=int(row["ffn"]), vocab_size=int(row["vocab"]), max_position_embeddings=int(row["seq_len"]),
        norm="layernorm" if gpt else "rmsnorm", mlp=row["mlp"], positions="learned" if gpt else "rope",
        tie_embeddings=gpt, qkv_bias=gpt, out_bias=gpt, mlp_bias=gpt,
    )


def recompute_from_row(row: dict[str, str]) -> Recompute:
    """The recompute policy a row ran; torchtitan's selective checkpointing is not Megatron's."""
    policy = Recompute(row["recompute"])
    if policy is Recompute.SELECTIVE and "torchtitan" in row["source"]:
        return Recompute.SELECTIVE_LAYER if "layer-level SAC" in row["notes"] else Recompute.SELECTIVE_OP
    return policy


def layout_from_row(row: dict[str, str]) -> Layout:
    """The layout a row ran, with the documented defaults for blank cells."""
    interleave = int(row["interleave"] or 1)
    torchtitan = "torchtitan" in row["source"]
    return Layout(
        dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"] or 1),
        micro_batch=int(row["micro_batch"] or 1), interleave=interleave,
        schedule=Schedule.INTERLEAVED if interleave > 1 else Schedule.ONE_F_ONE_B,
        recompute=recompute_from_row(row), sequence_parallel=row["sequence_parallel"] == "yes",
        zero_stage=int(row["zero_stage"]), attention=row["attention"], dp_overlap=row["dp_overlap"] == "yes",
        fused_elementwise=not torchtitan or "torch.compile" in row["notes"],
        tp_overlap="Korthikanti" in row["source"], batch_major=torchtitan, reentrant_recompute=not torchtitan,
        fsdp_copy_out=torchtitan,
    )


def evaluate(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """Simulate every row; one result dict per row."""
    results = []
    for row in rows:
        model, layout = model_from_row(row), layout_from_row(row)
        train = TrainConfig(seq_len=int(row["seq_len"]), global_batch=int(row["global_batch_seqs"]))
        machine = load_machine(row["hardware"], devices_per_node=int(row["devices_per_node"]))
        start = time.perf_counter()
        est = simulate(model, train, layout, machine)
        elapsed_s = time.perf_counter() - start
        measured = float(row["derived_step_time_s"])
        results.append({
            "source": row["source"].split(" (")[0], "table": row["table"], "model": row["model"], "hardware": row["hardware"],
            "devices": layout.n_devices, "layout": f"tp{layout.tp} pp{layout.pp} dp{layout.dp} mb{layout.micro_batch} "
            f"v{layout.interleave} {layout.recompute}{' sp' if layout.sequence_parallel else ''} z{layout.zero_stage}",
            "measured_s": measured, "predicted_s": est.step_time_s, "error_pct": 100 * (est.step_time_s - measured) / measured,
            "mfu": est.mfu, "fits": est.fits, "simulate_s": elapsed_s,
        })
    return results


def plan_simulate_s(args: tuple[str, ...] = PLAN_SIMULATE_1T) -> float:
    """Wall seconds of one ``plan simulate`` in a fresh interpreter, as a user runs it."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "planner.cli", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="published runs CSV")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/simulator_accuracy.csv"), help="where to write the CSV")
    args = parser.parse_args(argv)
    with args.data.open() as f:
        rows = list(csv.DictReader(f))
    results = evaluate(rows)
    print_table(f"Simulator vs published step time ({len(results)} runs)",
                [{k: v for k, v in r.items() if k not in ("source", "table", "simulate_s")} for r in results])
    errors = [abs(float(r["error_pct"])) for r in results]
    print(f"mean |error| {statistics.mean(errors):.2f} %   max |error| {max(errors):.2f} %   "
          f"slowest simulate() {max(float(r['simulate_s']) for r in results) * 1e3:.0f} ms")
    write_csv(args.out, results)
    print(f"wrote {args.out}")
    cli_s = plan_simulate_s()
    print(f"plan simulate, GPT-1T on 3072 devices: {cli_s:.2f} s (budget {PLAN_SIMULATE_BUDGET_S:.0f} s)")
    return 0 if cli_s < PLAN_SIMULATE_BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
