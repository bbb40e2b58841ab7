"""Simulator accuracy against published training runs.

Every row of ``../shared/data/published_training_runs.csv`` and of ``benchmarks/data/training_runs.csv``
(the development set, "published") is simulated from its own columns alone: model shape, devices,
hardware, layout, precision, and the software stack that ran it (its ``stack`` column, a preset of `costmodel.inputs.stack.STACKS`, with the
documented per-run deviations of ``stack_options``). The predicted step time is compared
with the one the source measured. So are the rows of ``benchmarks/data/heldout_runs.csv``:
published runs of the same sources that are not in the shared data and that no
calibration saw (torchtitan's eager FSDP rows on the capped H100, its per-op checkpointing
rows on the A100). Prints a table per set, then the error per hardware type, per source and
per stack, and the leave-one-source-out error (`leave_one_source_out_pct`), and writes one
CSV. The rows of ``benchmarks/data/fp8_runs.csv`` (MLPerf Training's fp8 GPT-3 175B runs and
Llama 2 70B LoRA fine-tuning runs) are a third set, simulated with ``--precision fp8``, and the rows
of ``benchmarks/data/finetune_runs.csv``, where it exists, a fourth ("finetune"). A row's
``workload`` column (blank: pretrain) and, for finetune-lora, its ``lora_rank``, ``lora_alpha``,
``lora_targets`` (matrices or groups: ``q,v``, ``attn``) and ``frozen_dtype`` columns say what step it ran (`workload_from_row`); what
such a row ran that the simulator does not model is printed beside it (`unmodelled`). It also
times ``plan simulate`` end to end (a fresh process, imports included) on the largest layout,
GPT-1T on 3072 devices, against a 1 s budget, and exits 1 past it.

    python -m benchmarks.simulator_accuracy [--data PATH] [--out benchmarks/out/simulator_accuracy.csv]

Blank cells: cp 1, precision bf16, vocabulary `ASSUMED_VOCAB`, no interleaving (1F1B) where
the micro-batch is stated; a blank micro-batch (the Megatron-LM README's rows), with any blank
interleaving, is the planner's choice for the stated layout (`planner_tuned`, as
``plan simulate --micro-batch auto --interleave auto`` chooses). A GPT row's
embeddings are tied unless its ``params_b`` is closer to the untied count (the
Megatron-Core rows: ``--untie-embeddings-and-output-weights``). "selective" recompute is
the stack's own selective recompute (`costmodel.inputs.layout.stack_recompute`); the attention
kernel and ``dp_overlap`` are the row's.

Nothing here is tuned per row: the only constants are the hardware profiles' and the
stacks' facts.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

from benchmarks.output import print_table, write_csv
from costmodel.hardware.catalog import CHIP, MICROBENCHMARK_EFFICIENCY
from costmodel.hardware.machine import Machine, load_machine, train_machine
from costmodel.hardware.profile import DEFAULT_RESERVES
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout, Offload, Schedule, stack_recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import SoftwareStack, apply_options, get_stack, stack_with
from costmodel.inputs.train_config import OptimizerState, Precision, TrainConfig
from costmodel.inputs.workload import FrozenDtype, LoraConfig, WorkloadKind
from costmodel.step.roofline import Efficiency
from costmodel.step.simulator import simulate
from search.unstated import choose_unstated

# The shared data sit beside the project's checkout (main or a worktree under it).
DEFAULT_DATA = next((p / "shared" / "data" / "published_training_runs.csv" for p in Path(__file__).resolve().parents
                     if (p / "shared" / "data" / "published_training_runs.csv").exists()),
                    Path(__file__).resolve().parents[2] / "shared" / "data" / "published_training_runs.csv")
# More published bf16 runs, from sources the shared data do not have: part of the development set.
TRAINING_DATA = Path(__file__).resolve().parent / "data" / "training_runs.csv"
HELDOUT_DATA = Path(__file__).resolve().parent / "data" / "heldout_runs.csv"
FP8_DATA = Path(__file__).resolve().parent / "data" / "fp8_runs.csv"
FINETUNE_DATA = Path(__file__).resolve().parent / "data" / "finetune_runs.csv"
# What a row's notes name that the simulator does not model, and what it runs instead.
UNMODELLED_NOTES = {
    "FP8_DPA=1": "fp8 attention (FP8_DPA) is not modelled: attention runs in bf16",
    "FP8_ACTIVATION=True": "fp8 activation storage (FP8_ACTIVATION) is not modelled: kept activations in bf16",
}
# MLPerf's GPT-3 rows do not state their SentencePiece vocabulary: GPT-3's own 50257 stands in
# (a few percent either way moves a 175B step by well under 0.1 %). It is padded to 50304 as
# Megatron-LM pads it (`ModelConfig.padded_vocab_size`), so the head splits over the tensor axes.
ASSUMED_VOCAB = 50257
# Narayanan et al.'s largest run: a 1T-parameter GPT on 3072 A100s, tp8 pp64 dp6, as its stack ran it.
PLAN_SIMULATE_1T = ("simulate", "--model", "megatron-gpt-1008b", "--hardware", "a100-80gb", "--devices", "3072", "--tp", "8",
                    "--pp", "64", "--global-batch", "3072", "--recompute", "full", "--stack", "megatron-lm-2021",
                    "--precision", "fp16", "--dp-overlap", "no", "--json")
PLAN_SIMULATE_BUDGET_S = 1.0
# Leave-one-source-out refits each hardware type's GEMM scale, as a multiple of its profile's
# curve, over this grid; parts that are one hardware type under two names share the fit.
LOSO_GEMM_SCALES = tuple(round(0.70 + 0.03 * i, 2) for i in range(21))
# The GEMM scales a micro-benchmark curve may be fitted to (`benchmarks.calibrate.GRID`): large GEMMs
# within 0.55-0.90 of peak on the curves of `costmodel.hardware.catalog.MICROBENCHMARK_EFFICIENCY`.
MICROBENCHMARK_GEMM_SCALES = tuple(round(0.70 + 0.02 * i, 2) for i in range(16))
HARDWARE_TYPE = {"h100-95gb-hbm2e-lowtdp": "h100-96gb-hbm2e-500w"}
# The sets whose step-time rows are also predicted leaving each source out.
LOSO_SETS = ("published", "finetune")


def model_from_row(row: dict[str, str]) -> ModelConfig:
    """The model a row trained, from its own columns."""
    gpt = row["arch"] == "gpt"
    model = ModelConfig(
        name=row["model"], hidden_size=int(row["hidden"]), num_layers=int(row["layers"]), num_heads=int(row["heads"]),
        num_kv_heads=int(row["kv_heads"]), head_dim=int(row["head_dim"]) if row["head_dim"] else None,
        ffn_size=int(row["ffn"]), vocab_size=int(row["vocab"] or ASSUMED_VOCAB), max_position_embeddings=int(row["seq_len"]),
        norm="layernorm" if gpt else "rmsnorm", mlp=row["mlp"], positions="learned" if gpt else "rope",
        tie_embeddings=gpt, qkv_bias=gpt, out_bias=gpt, mlp_bias=gpt,
    )
    untied = model.model_copy(update={"tie_embeddings": False})
    published = float(row["params_b"]) * 1e9
    return untied if gpt and abs(untied.total_params - published) < abs(model.total_params - published) else model


def stack_from_row(row: dict[str, str]) -> SoftwareStack:
    """The row's software stack: its preset with the row's documented ``stack_options``."""
    return apply_options(get_stack(row["stack"] or "jax"), row["stack_options"])


def layout_from_row(row: dict[str, str], machine: Machine) -> Layout:
    """The layout a row ran on ``machine``: its own cells on its stack; where the source leaves the
    micro-batch unstated, the micro-batch and interleaving `planner_tuned` chooses for the rest."""
    interleave, stack = int(row["interleave"] or 1), stack_from_row(row)
    layout = Layout(
        dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"] or 1),
        micro_batch=int(row["micro_batch"] or 1), interleave=interleave,
        schedule=Schedule.INTERLEAVED if interleave > 1 else Schedule.ONE_F_ONE_B,
        recompute=stack_recompute(row["recompute"], stack), sequence_parallel=row["sequence_parallel"] == "yes",
        zero_stage=int(row["zero_stage"]), offload=Offload.PARAMS if row.get("param_offload") == "yes" else Offload.NONE,
        offload_activations=row.get("activation_offload") == "yes",
        stack=stack_with(stack, attention=row["attention"], dp_overlap=row["dp_overlap"] == "yes"),
    )
    if row["micro_batch"]:
        return layout
    return planner_tuned(model_from_row(row), train_from_row(row), layout, machine, interleave=not row["interleave"])


def planner_tuned(model: ModelConfig, train: TrainConfig, layout: Layout, machine: Machine, *, interleave: bool) -> Layout:
    """``layout`` with the micro-batch (and, where ``interleave``, the model chunks per pipeline
    device) chosen as ``plan simulate --micro-batch auto [--interleave auto]`` chooses them with
    every other knob held (`search.unstated`): the fastest that fits.

    A throughput table reports a tuned run, so a knob it does not state is taken as tuned,
    by the same cost model that predicts the row, on the user's path.
    """
    unstated = ("micro_batch", "interleave") if interleave else ("micro_batch",)
    return choose_unstated(model, train, layout, machine, unstated=unstated).layout


def workload_from_row(row: dict[str, str]) -> dict[str, object]:
    """A row's workload and LoRA settings from its own columns (absent or blank: pretraining).

    >>> workload_from_row({"workload": "finetune-lora", "lora_rank": "16", "lora_alpha": "32", "lora_targets": "attn",
    ...                    "frozen_dtype": "fp8"})["lora"].frozen_dtype.value
    'fp8'
    """
    workload = row.get("workload") or WorkloadKind.PRETRAIN.value
    settings = _ROW_SETTINGS.get(workload)
    return {"workload": workload} | ({settings[0]: settings[1](row)} if settings else {})


def _lora_from_row(row: dict[str, str]) -> LoraConfig:
    return LoraConfig(rank=int(row["lora_rank"]), alpha=float(row["lora_alpha"]), targets=row["lora_targets"],
                      frozen_dtype=FrozenDtype(row["frozen_dtype"] or FrozenDtype.BF16.value),
                      dropout=float(row.get("lora_dropout") or 0.0), fused_qkv=row.get("lora_fused_qkv") == "yes")


# The settings columns of each workload that has some: (`TrainConfig` keyword, their parser).
_ROW_SETTINGS = {WorkloadKind.FINETUNE_LORA.value: ("lora", _lora_from_row)}


def train_from_row(row: dict[str, str]) -> TrainConfig:
    """Sequence length, batch, workload, precision and optimizer state (``optimizer_state``,
    ``optimizer_in_backward``; blank: fp32 master weights) of a row."""
    train = TrainConfig(seq_len=int(row["seq_len"]), global_batch=int(row["global_batch_seqs"]), **workload_from_row(row))
    train = train.with_precision(Precision(row["precision"] or "bf16"))
    state = row.get("optimizer_state") or OptimizerState.FP32.value
    if state == OptimizerState.FP32.value and row.get("optimizer_in_backward") != "yes":
        return train
    return train.with_optimizer_state(OptimizerState(state), in_backward=row.get("optimizer_in_backward") == "yes")


def machine_from_row(row: dict[str, str]) -> Machine:
    """The row's hardware profile as the row's precision runs on it (fp8: the linear layers at the fp8 peak)."""
    return train_machine(load_hardware(row["hardware"], devices_per_node=int(row["devices_per_node"])), train_from_row(row))


def unmodelled(rows: list[dict[str, str]]) -> list[str]:
    """A line for each thing a row ran that the simulator does not model (`UNMODELLED_NOTES`)."""
    return [f"{r['model']} on {r['devices']} {r['hardware']}: {why}"
            for r in rows for note, why in UNMODELLED_NOTES.items() if note in r["notes"]]


def evaluate_memory(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """The simulator's per-device memory against a row's measured peak (``peak_memory_gib_per_device``): its
    arrays, plus what the row's ``memory_measure`` counts beside them (`RuntimeReserve.measured_beyond_arrays`:
    the allocator's fragmentation for a reserved peak, also the CUDA context and NCCL's buffers for a driver
    reading; nothing for an allocated peak or an unstated measure)."""
    results = []
    for row in rows:
        model, train, machine = model_from_row(row), train_from_row(row), machine_from_row(row)
        layout = layout_from_row(row, machine)
        device = load_hardware(row["hardware"]).device
        runtime = DEFAULT_RESERVES[device.kind].measured_beyond_arrays(row.get("memory_measure") or "allocated", device.usable_bytes,
                                                                       communicates=layout.n_devices > 1)
        predicted_gib = (simulate(model, train, layout, machine).memory.total_bytes + runtime) / 2**30
        measured_gib = float(row["measured_value"])
        results.append({"source": source_family(row), "model": row["model"], "hardware": row["hardware"],
                        "frozen_dtype": row["frozen_dtype"], "measure": row.get("memory_measure") or "unstated",
                        "devices": layout.n_devices, "micro_batch": layout.micro_batch,
                        "measured_gib": measured_gib, "predicted_gib": predicted_gib,
                        "error_pct": 100 * (predicted_gib - measured_gib) / measured_gib})
    return results


def evaluate(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """Simulate every row; one result dict per row."""
    results = []
    for row in rows:
        model, train, machine = model_from_row(row), train_from_row(row), machine_from_row(row)
        layout = layout_from_row(row, machine)
        start = time.perf_counter()
        est = simulate(model, train, layout, machine)
        elapsed_s = time.perf_counter() - start
        measured = float(row["derived_step_time_s"])
        results.append({
            "source": row["source"].split(" (")[0], "table": row["table"], "model": row["model"], "hardware": row["hardware"],
            "stack": row["stack"] or "jax", "workload": train.workload.kind,
            "devices": layout.n_devices, "layout": f"tp{layout.tp} pp{layout.pp} dp{layout.dp} mb{layout.micro_batch} "
            f"v{layout.interleave} {layout.recompute}{' sp' if layout.sequence_parallel else ''} z{layout.zero_stage}",
            "measured_s": measured, "predicted_s": est.step_time_s, "error_pct": 100 * (est.step_time_s - measured) / measured,
            "mfu": est.mfu, "fits": est.fits, "simulate_s": elapsed_s,
        })
    return results


def source_family(row: dict[str, str]) -> str:
    """The publication or repository a row comes from: every document of one repository is one source.

    >>> source_family({"source": "pytorch/torchtitan benchmarks/llama3_h100_202412"})
    'pytorch/torchtitan'
    """
    return row["source"].split()[0]


def microbenchmark_efficiency(hardware: str) -> Efficiency:
    """A part's efficiencies before any calibration: its micro-benchmark profile, or its catalog's where it has none.

    >>> microbenchmark_efficiency("h100-sxm") == MICROBENCHMARK_EFFICIENCY["h100-sxm"]
    True
    """
    return MICROBENCHMARK_EFFICIENCY.get(hardware, load_machine(hardware).efficiency)


# A change to how a row is simulated (`benchmarks.ablation`): its layout and machine as run → as simulated.
Variant = Callable[[Layout, Machine], tuple[Layout, Machine]]


def as_run(layout: Layout, machine: Machine) -> tuple[Layout, Machine]:
    """The row as it ran: no change."""
    return layout, machine


def step_error_pct(row: dict[str, str], efficiency: Efficiency, variant: Variant = as_run) -> float:
    """Signed step-time error (%) of a row simulated on its hardware with ``efficiency``, ``variant`` applied."""
    machine = machine_from_row(row).model_copy(update={"efficiency": efficiency})
    layout, machine = variant(layout_from_row(row, machine), machine)
    est = simulate(model_from_row(row), train_from_row(row), layout, machine)
    measured = float(row["derived_step_time_s"])
    return 100 * (est.step_time_s - measured) / measured


def _errors_at_scale(rows: list[dict[str, str]], scale: float, *, microbenchmark: bool, variant: Variant = as_run) -> list[float]:
    out = []
    for row in rows:
        base = microbenchmark_efficiency(row["hardware"]) if microbenchmark else machine_from_row(row).efficiency
        out.append(step_error_pct(row, base.calibrated(matmul_scale=scale, flash_attention=base.flash_attention, hbm=base.hbm),
                                  variant))
    return out


def hardware_type(row: dict[str, str]) -> str:
    """The hardware type a row's part is calibrated as (`HARDWARE_TYPE`)."""
    return HARDWARE_TYPE.get(row["hardware"], row["hardware"])


def chip_transfer_pct(test: list[dict[str, str]], rows: list[dict[str, str]], variant: Variant = as_run) -> list[float]:
    """Errors (%) of the ``test`` rows, whose hardware type has no other source's runs, predicted
    from what other parts of their chip (`costmodel.hardware.catalog.CHIP`) teach: every part's
    micro-benchmark efficiencies with the one GEMM scale (`MICROBENCHMARK_GEMM_SCALES`) that fits
    the rows of ``rows`` on other hardware types of that chip and from other sources best; with
    no such rows, the micro-benchmark efficiencies as they are."""
    chip, family = CHIP.get(test[0]["hardware"]), source_family(test[0])
    siblings = [r for r in rows if chip and CHIP.get(r["hardware"]) == chip and hardware_type(r) != hardware_type(test[0])
                and source_family(r) != family]
    if not siblings:
        return _errors_at_scale(test, 1.0, microbenchmark=True, variant=variant)
    scale = min(MICROBENCHMARK_GEMM_SCALES,
                key=lambda s: statistics.mean(map(abs, _errors_at_scale(siblings, s, microbenchmark=True, variant=variant))))
    return _errors_at_scale(test, scale, microbenchmark=True, variant=variant)


def leave_one_source_out_pct(rows: list[dict[str, str]], variant: Variant = as_run) -> list[float]:
    """Each row's error (%) predicted without its source: its hardware type's GEMM scale refitted
    (least mean |error| over `LOSO_GEMM_SCALES`) on the other sources' rows of that type, the
    profile's other fitted efficiencies kept; where no other source ran on that hardware type,
    from the other parts of its chip (`chip_transfer_pct`, as ``benchmarks/calibrate.py``). ``variant``
    changes how every row is simulated, refits included (`benchmarks.ablation`)."""
    held_out = [0.0] * len(rows)
    by_type: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by_type[hardware_type(row)].append(i)
    for indices in by_type.values():
        typed = [rows[i] for i in indices]
        table = [_errors_at_scale(typed, scale, microbenchmark=False, variant=variant) for scale in LOSO_GEMM_SCALES]
        for family in {source_family(r) for r in typed}:
            test = [j for j, r in enumerate(typed) if source_family(r) == family]
            train = [j for j, r in enumerate(typed) if source_family(r) != family]
            if train:
                best = min(range(len(LOSO_GEMM_SCALES)), key=lambda k: statistics.mean(abs(table[k][j]) for j in train))
                errors = [table[best][j] for j in test]
            else:
                errors = chip_transfer_pct([typed[j] for j in test], rows, variant)
            for j, err in zip(test, errors):
                held_out[indices[j]] = err
    return held_out


def plan_simulate_s(args: tuple[str, ...] = PLAN_SIMULATE_1T) -> float:
    """Wall seconds of one ``plan simulate`` in a fresh interpreter, as a user runs it."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "planner.cli", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def error_summary(results: list[dict[str, object]], key: str) -> list[dict[str, object]]:
    """Mean |error|, signed mean (a bias shows there) and max |error| of ``results`` grouped by ``key``
    (hardware, source or stack).

    >>> error_summary([{"stack": "a", "error_pct": -2.0}, {"stack": "a", "error_pct": 4.0}], "stack")
    [{'stack': 'a', 'runs': 2, 'mean_abs_err_pct': 3.0, 'signed_mean_err_pct': 1.0, 'max_abs_err_pct': 4.0}]
    """
    groups: dict[str, list[float]] = defaultdict(list)
    for r in results:
        groups[str(r[key])].append(float(r["error_pct"]))
    return [{key: name, "runs": len(errs), "mean_abs_err_pct": statistics.mean(map(abs, errs)),
             "signed_mean_err_pct": statistics.mean(errs), "max_abs_err_pct": max(map(abs, errs))}
            for name, errs in sorted(groups.items())]


def _report(title: str, results: list[dict[str, object]]) -> None:
    print_table(f"{title} ({len(results)} runs)",
                [{k: v for k, v in r.items() if k not in ("set", "source", "table", "simulate_s", "loso_error_pct")} for r in results])
    errors = [abs(float(r["error_pct"])) for r in results]
    print(f"mean |error| {statistics.mean(errors):.2f} %   max |error| {max(errors):.2f} %   "
          f"slowest simulate() {max(float(r['simulate_s']) for r in results) * 1e3:.0f} ms")
    for key in ("hardware", "source", "stack"):
        print_table(f"{title}: |error| per {key}", error_summary(results, key))


def data_sets(published: tuple[Path, ...], heldout: Path, fp8: Path, finetune: Path) -> list[tuple[str, tuple[Path, ...]]]:
    """The sets evaluated, by name, each on the same code path; the fine-tuning set only where its CSV exists.

    >>> [name for name, _ in data_sets((DEFAULT_DATA, TRAINING_DATA), HELDOUT_DATA, FP8_DATA, Path("/nonexistent.csv"))]
    ['published', 'held out', 'fp8']
    """
    sets = [("published", published), ("held out", (heldout,)), ("fp8", (fp8,))]
    return sets + ([("finetune", (finetune,))] if finetune.exists() else [])


def read_rows(path: Path) -> list[dict[str, str]]:
    """A data CSV's rows as dicts of strings."""
    with path.open() as f:
        return list(csv.DictReader(f))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="published runs CSV")
    parser.add_argument("--more", type=Path, default=TRAINING_DATA, help="more published runs, of the development set too")
    parser.add_argument("--heldout", type=Path, default=HELDOUT_DATA, help="published runs never calibrated on")
    parser.add_argument("--fp8", type=Path, default=FP8_DATA, help="published fp8 runs (benchmarks/data/README.md)")
    parser.add_argument("--finetune", type=Path, default=FINETUNE_DATA, help="published fine-tuning runs (used where it exists)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/simulator_accuracy.csv"), help="where to write the CSV")
    args = parser.parse_args(argv)
    results = []
    for name, paths in data_sets((args.data, args.more), args.heldout, args.fp8, args.finetune):
        raw = [row for path in paths for row in read_rows(path)]
        for line in unmodelled(raw):
            print(f"{name}: not modelled: {line}")
        memory_rows = [r for r in raw if r["measured_metric"] == "peak_memory_gib_per_device"]
        if memory_rows:
            memory = evaluate_memory(memory_rows)
            print_table(f"Simulator vs published peak memory per device, {name}", memory)
            errors = [abs(float(r["error_pct"])) for r in memory]
            print_table(f"{name}: peak memory |error| per source", error_summary(memory, "source"))
            # No constant is fitted to memory rows, so leaving a source out changes nothing.
            print(f"mean |error| {statistics.mean(errors):.2f} %   max |error| {max(errors):.2f} % "
                  "(also leave-one-source-out: no memory constant is fitted)")
            raw = [r for r in raw if r not in memory_rows]
        rows = [{"set": name, **r} for r in evaluate(raw)]
        _report(f"Simulator vs published step time, {name}", rows)
        if name in LOSO_SETS:
            for r, loso in zip(rows, leave_one_source_out_pct(raw)):
                r["loso_error_pct"] = loso
            print_table(f"{name}: leave-one-source-out |error| per source", error_summary(
                [{"source": source_family(raw_row), "error_pct": r["loso_error_pct"]} for raw_row, r in zip(raw, rows)], "source"))
            loso = [abs(float(r["loso_error_pct"])) for r in rows]
            print(f"leave-one-source-out mean |error| {statistics.mean(loso):.2f} %   max |error| {max(loso):.2f} %")
        results += rows
    write_csv(args.out, results)
    print(f"wrote {args.out}")
    cli_s = plan_simulate_s()
    print(f"plan simulate, GPT-1T on 3072 devices: {cli_s:.2f} s (budget {PLAN_SIMULATE_BUDGET_S:.0f} s)")
    return 0 if cli_s < PLAN_SIMULATE_BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
