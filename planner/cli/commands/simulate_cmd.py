"""``plan simulate``: predict step time and memory of one hand-written layout."""

from __future__ import annotations

import argparse
import json

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidPlanError, flag_error
from costmodel.hardware.machine import train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout, Offload, Recompute, Schedule, stack_recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.simulator import simulate
from planner.api import layout_plan
from planner.cli.commands.arg_types import (
    AUTO,
    PRECISION_HELP,
    add_memory_reserve_argument,
    non_negative_int,
    positive_int,
    positive_int_or_auto,
)
from planner.cli.commands.optimizer_args import add_optimizer_arguments, optimizer_from_args
from planner.cli.commands.stack_args import add_stack_arguments, stack_from_args
from planner.cli.commands.workload_args import add_workload_arguments, serving_sizes, workload_from_args
from planner.cli.tables import jax_memory_row, memory_rows, memory_total_row, offload_rows, serving_rows, titled_workload, utilisation_row
from planner.cli.timeline import write_timeline
from planner.config import default_seq_len, load_model, train_config
from planner.request import PlanRequest
from search.unstated import UNSTATABLE, UnstatedChoice, choose_unstated

_GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name or config.json path")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile name or JSON path (default h100-sxm)")
    parser.add_argument("--devices", type=positive_int, required=True, help="total devices")
    parser.add_argument("--devices-per-node", type=positive_int, help="override the profile's devices per node")
    add_memory_reserve_argument(parser)
    for flag, help_text in (("--tp", "tensor parallel"), ("--pp", "pipeline stages"), ("--cp", "context parallel"),
                            ("--ep", "expert parallel")):
        parser.add_argument(flag, type=positive_int, default=1, help=f"{help_text} degree (default 1)")
    parser.add_argument("--tp-embed", type=positive_int, default=1,
                        help="decode only: of the --tp devices, how many also split each weight's model dimension (2D "
                             "weight-stationary; default 1, the 1D layout)")
    parser.add_argument("--dp", type=positive_int, help="data parallel degree (default: devices / (tp·pp·cp))")
    parser.add_argument("--global-batch", type=positive_int, help="sequences per step (training workloads; serving takes --batch)")
    parser.add_argument("--micro-batch", type=positive_int_or_auto, default=1,
                        help="sequences per micro-batch (default 1; auto: the planner chooses, as for each knob below)")
    parser.add_argument("--seq-len", type=positive_int,
                        help="tokens per sequence (default 2048, or the model's learned positions if fewer)")
    parser.add_argument("--interleave", type=positive_int_or_auto, default=1, help="model chunks per pipeline device (default 1)")
    parser.add_argument("--schedule", choices=[s.value for s in Schedule],
                        help="pipeline schedule (default 1f1b, interleaved when --interleave > 1)")
    parser.add_argument("--recompute", choices=[*(r.value for r in Recompute), AUTO], default="none", help="activation recompute")
    parser.add_argument("--sequence-parallel", nargs="?", const="yes", default="no", choices=["yes", "no", AUTO],
                        help="Megatron sequence parallelism (the flag alone: yes)")
    parser.add_argument("--zero", type=non_negative_int, choices=[0, 1, 2, 3], default=0, help="ZeRO stage (3 = FSDP)")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default="bf16",
                        help=PRECISION_HELP)
    parser.add_argument("--offload", choices=[o.value for o in Offload], default="none",
                        help="none (default); optimizer: master weights, Adam moments and fp32 gradients on host memory, "
                             "Adam on the CPU (ZeRO-Offload as DeepSpeed runs it); params: with --zero 3, every shard there "
                             "too (FSDP's CPU offload)")
    parser.add_argument("--offload-activations", action="store_true",
                        help="saved activations to host memory in the forward and back for the backward (torchtune's "
                             "activation offloading)")
    add_workload_arguments(parser)
    add_optimizer_arguments(parser)
    add_stack_arguments(parser)
    parser.add_argument("--timeline", help="write the pipeline timeline to this PNG file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def layout_from_args(args: argparse.Namespace) -> Layout:
    """The Layout the flags describe; inconsistent degrees get one line naming the fix."""
    rest = args.tp * args.pp * args.cp
    if args.dp is None and args.devices % rest:
        raise InvalidPlanError(f"devices={args.devices} is not divisible by tp·pp·cp = {rest}", fix="change --devices or the degrees")
    stated = {knob: value for knob, value in _knobs(args).items() if value != AUTO}  # the auto ones: placeholders here
    interleave = stated.get("interleave", 1)
    schedule = args.schedule or (Schedule.INTERLEAVED if interleave > 1 else Schedule.ONE_F_ONE_B)
    stack = stack_from_args(args)
    try:
        return Layout(
            dp=args.dp or args.devices // rest, tp=args.tp, tp_embed=args.tp_embed, pp=args.pp, cp=args.cp, ep=args.ep,
            micro_batch=stated.get("micro_batch", 1),
            interleave=interleave, schedule=schedule, recompute=stack_recompute(stated.get("recompute", "none"), stack),
            sequence_parallel=stated.get("sequence_parallel", "no") == "yes", zero_stage=args.zero, stack=stack, offload=args.offload,
            offload_activations=args.offload_activations,
        )
    except ValidationError as err:
        raise flag_error(err, InvalidPlanError) from None


def _knobs(args: argparse.Namespace) -> dict[str, object]:
    """The knobs a described run may leave unstated (`search.unstated.UNSTATABLE`), as the flags give them."""
    return {knob: getattr(args, knob) for knob in UNSTATABLE}


def run(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    workload = workload_from_args(args)
    sizes = {"seq_len": args.seq_len or default_seq_len(model), "global_batch": args.global_batch} | serving_sizes(args)
    if sizes["global_batch"] is None:
        raise InvalidPlanError("plan simulate needs the batch of the step",
                               fix="add --global-batch N (or --batch N for prefill and decode)")
    train = train_config(**sizes, **workload)
    optimizer = optimizer_from_args(args)
    train = train.with_precision(Precision(args.precision)).with_optimizer_state(
        optimizer["optimizer_state"], in_backward=optimizer["optimizer_in_backward"])
    layout = layout_from_args(args)
    if layout.n_devices != args.devices:
        raise InvalidPlanError(
            f"tp·pp·dp·cp = {layout.tp}·{layout.pp}·{layout.dp}·{layout.cp} = {layout.n_devices} but --devices={args.devices}",
            fix="make the degrees multiply to the device count",
        )
    cluster = load_hardware(args.hardware, devices_per_node=args.devices_per_node)
    machine = train_machine(cluster.with_memory_reserve(None if args.memory_reserve_gib is None else args.memory_reserve_gib * _GIB),
                            train)
    unstated = tuple(knob for knob, value in _knobs(args).items() if value == AUTO)
    chosen = None
    if unstated and not train.workload.runs_backward:
        flag = "--" + unstated[0].replace("_", "-")
        raise InvalidPlanError(f"{flag} auto: a {train.workload.kind} step has no {unstated[0].replace('_', ' ')} to choose "
                               "(its layout is the degrees alone)", fix=f"drop {flag}")
    if unstated:
        choice = choose_unstated(model, train, layout, machine, unstated=unstated)
        layout, chosen = choice.layout, choice
    estimate = simulate(model, train, layout, machine, keep_timeline=bool(args.timeline))
    if args.timeline:
        write_timeline(estimate, args.timeline)
    if args.json:
        print(json.dumps(estimate_json(estimate) | ({"unstated_chosen": chosen.chosen} if chosen else {}), sort_keys=True))
    else:
        Console().print(_table(estimate, f"{model.name}{titled_workload(train)}", lora=not train.workload.trains_base_weights)
                        if train.workload.runs_backward else _serving_table(estimate, model, train))
        if chosen:
            Console().print(chosen_line(chosen), highlight=False)
    return 0


def chosen_line(choice: UnstatedChoice) -> str:
    """What the planner chose for the knobs left ``auto``, and among how many layouts.

    >>> choice = UnstatedChoice.model_construct(chosen={"micro_batch": 2, "sequence_parallel": True}, evaluated=8, fits=True)
    >>> chosen_line(choice)
    'chosen by the planner (auto): --micro-batch 2 --sequence-parallel yes, the fastest that fits of 8 layouts simulated'
    """
    flags = " ".join(f"--{knob.replace('_', '-')} {_spelled(value)}" for knob, value in choice.chosen.items())
    verdict = "the fastest that fits" if choice.fits else "none fits: the one needing the least memory"
    return f"chosen by the planner (auto): {flags}, {verdict} of {choice.evaluated} layouts simulated"


def _spelled(value: object) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else str(getattr(value, "value", value))


def estimate_json(est: StepEstimate) -> dict[str, object]:
    """The JSON object ``plan simulate --json`` prints."""
    return est.model_dump(mode="json", exclude={"timeline"})


def _serving_table(est: StepEstimate, model: ModelConfig, train: TrainConfig) -> Table:
    """A serving estimate's rows, as `plan` prints them for its choice."""
    lay = est.layout
    request = PlanRequest(model=model, hardware=est.hardware, seq_len=train.seq_len, global_batch=train.global_batch,
                          workload=train.workload.kind, inference=train.workload.serving)
    p = layout_plan(request, lay).model_copy(update={"predicted": est})
    table = Table(title=f"{model.name}{titled_workload(train)} on {est.n_devices}× {est.hardware}: {lay.degrees_text}",
                  show_header=False)
    for name, value in serving_rows(p) + [("fits", "yes" if est.fits else "NO")]:
        table.add_row(name, value)
    return table


def _table(est: StepEstimate, model: str, *, lora: bool) -> Table:
    lay, b, m = est.layout, est.breakdown, est.memory
    table = Table(title=f"{model} on {est.n_devices}× {est.hardware}: {lay.degrees_text} "
                        f"mb{lay.micro_batch} {lay.recompute} recompute, ZeRO {lay.zero_stage}, stack {lay.stack.name}",
                  show_header=False)
    rows = [
        ("step time", f"{est.step_time_s:.3f} s"), ("tokens/s", f"{est.tokens_per_s:,.0f}"),
        utilisation_row(est),
        ("  compute (matmul, attention)", f"{b.compute_s:.3f} s"), ("  memory-bound kernels", f"{b.memory_bound_s:.3f} s"),
        ("  recompute", f"{b.recompute_s:.3f} s"), ("  pipeline bubble", f"{b.bubble_s:.3f} s"),
        ("  exposed communication", f"{b.exposed_comm_s:.3f} s"), ("  optimizer", f"{b.optimizer_s:.3f} s"),
        *((("  offload: PCIe exposed / CPU Adam", f"{b.offload_transfer_s:.3f} / {b.cpu_optimizer_s:.3f} s"),) if b.offload else ()),
        *((f"  {axis} collectives (total)", f"{t:.3f} s") for axis, t in b.comm_s_by_axis.items() if t > 0),
        memory_total_row(m, digits=2),
        *memory_rows(m, lora=lora, digits=2, state="parameters / gradients / optimizer"),
        *offload_rows(est, reason=None),
        ("fits", "yes" if est.fits else f"NO: over {m.limit_text()}" if est.fits is False else "unknown"),
        *filter(None, [jax_memory_row(m)]),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
