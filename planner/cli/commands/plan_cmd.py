"""``plan --model M --mesh 8x4``: choose a layout, print it and why; optionally write it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidConfigError
from costmodel.hardware.machine import train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Offload
from costmodel.inputs.train_config import Precision
from costmodel.step.run_overheads import DEFAULT_CHECKPOINT_EVERY_S, RunOverheads, RunSettings
from costmodel.step.simulator import simulate
from planner.api import plan
from planner.cli import exports
from planner.cli.commands.arg_types import PRECISION_HELP, add_memory_reserve_argument, non_negative_int, positive_float, positive_int
from planner.cli.commands.optimizer_args import add_optimizer_arguments, optimizer_from_args
from planner.cli.commands.pin_args import add_pin_arguments, pins_from_args
from planner.cli.commands.stack_args import add_stack_arguments, stack_from_args
from planner.cli.commands.workload_args import add_workload_arguments, serving_sizes, workload_from_args
from planner.cli.html_report import html_report
from planner.cli.progress import progress_display, wanted
from planner.cli.tables import (
    jax_memory_row,
    memory_rows,
    memory_total_row,
    offload_rows,
    serving_rows,
    titled_workload,
    utilisation_row,
    workload_label,
    xla_flags_row,
)
from planner.plan_schema import Plan
from planner.request import PlanRequest, plan_request

_GIB = 2**30
OFFLOADED = {Offload.OPTIMIZER: " · optimizer offloaded", Offload.PARAMS: " · parameters offloaded"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name or config.json path")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--mesh", help="device mesh, e.g. 8x4 or data=8,tensor=4")
    where.add_argument("--devices", type=positive_int, help="device count; the planner chooses the mesh")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile name or JSON path (default h100-sxm)")
    parser.add_argument("--devices-per-node", type=positive_int, help="override the profile's devices per node")
    add_memory_reserve_argument(parser)
    parser.add_argument("--seq-len", type=positive_int,
                        help="tokens per sequence (default 2048, or the model's learned positions if fewer)")
    parser.add_argument("--global-batch", type=positive_int,
                        help="sequences per step (default: chosen by DeepSeek LLM's batch rule for the model and --tokens, "
                             "a multiple of the device count; the summary's batch row says why)")
    parser.add_argument("--tokens", type=positive_float,
                        help="training tokens, e.g. 15e12: also predict days to train and device-hours at the plan's step time, "
                             "with the input pipeline's stalls and the checkpoint writes")
    parser.add_argument("--checkpoint-every-s", type=positive_float, default=DEFAULT_CHECKPOINT_EVERY_S,
                        help="with --tokens: seconds of training between checkpoints (default 3600)")
    parser.add_argument("--loader", choices=["prefetch", "blocking"], default="prefetch",
                        help="with --tokens: prefetch (reads overlap the step; default) or blocking (each step waits for its read)")
    # Checked by planner.request, so an unknown name gets the error catalog's one line.
    parser.add_argument("--planner", default="grid",
                        help="grid: layout search with Megatron sharding rules (default); ilp: the same search, then the "
                             "CP-SAT intra-op ILP shards every parameter and op of a stage; anneal/beam/random: search "
                             "planners on the ILP's strategy space")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default="bf16",
                        help=PRECISION_HELP)
    parser.add_argument("--offload", choices=["auto", *(o.value for o in Offload)], default="auto",
                        help="what goes to host memory: auto (only when no layout fits without, the optimizer state "
                             "first; default), none, optimizer (ZeRO-Offload: its state, Adam on the CPU) or params (FSDP's "
                             "CPU offload of every ZeRO-3 shard)")
    parser.add_argument("--offload-activations", action="store_true",
                        help="plan with the saved activations offloaded to host memory (torchtune's activation offloading)")
    add_workload_arguments(parser)
    add_optimizer_arguments(parser)
    add_stack_arguments(parser)
    add_pin_arguments(parser)
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed of a search planner (default 0)")
    parser.add_argument("--time-limit-s", type=positive_float, default=20.0,
                        help="limit of the layout search and, separately, of the intra-op planner; when it runs out the best "
                             "plan found is kept and solver.status says FEASIBLE (default 20)")
    parser.add_argument("--format", choices=list(FORMATS), default="summary",
                        help="what to print: rich summary, Plan JSON, parameter specs, MaxText overrides, Megatron-LM arguments, "
                             "DeepSpeed config JSON with launcher arguments, torchtitan TOML (each planned on its stack: "
                             "maxtext, megatron-core, deepspeed, torchtitan), Flax logical axis rules, Markdown report, or a "
                             "self-contained HTML report (with --out, written there instead of the JSON)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (same as --format json)")
    parser.add_argument("--out", help="also write the plan JSON (with --format html: the HTML report) to this file "
                                      "(atomically; the same inputs give the same bytes)")
    parser.add_argument("--force", action="store_true", help="let --out replace an existing file")


def run(args: argparse.Namespace) -> int:

    if args.out:
        check_out(Path(args.out), force=args.force)  # before planning, which may take a while
    fmt = "json" if args.json else args.format
    format_stack(args, fmt)
    request = request_from_args(args)
    start = time.perf_counter()
    with progress_display(enabled=wanted(fmt)) as report:
        result = plan(request, progress=report)
    plan_time_s = time.perf_counter() - start
    if result.batch and result.batch.warning:
        print(f"warning: {result.batch.warning}", file=sys.stderr)
    if fmt in FORMAT_STACKS and result.layout.tp_embed > 1:
        raise InvalidConfigError(f"--format {fmt}: {FORMAT_STACKS[fmt][0]} has no 2D weight-stationary split, which this plan "
                                 f"chose ({result.layout.degrees_text})", fix="use --format specs or json (the JAX program's "
                                 "shardings), or give --mesh (on a given mesh the split stays 1D)")
    page = _html(result, args) if fmt == "html" else None
    if args.out:
        try:
            write_atomic(Path(args.out), page or result.model_dump_json(indent=1) + "\n")
        except OSError as err:
            raise InvalidConfigError(f"cannot write {args.out}: {err.strerror or err}",
                                     fix="check the directory's permissions and free space") from err
    FORMATS[fmt](result, Shown(plan_time_s=plan_time_s, html_page=page, html_written=bool(args.out)))
    return 0


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    """The `PlanRequest` the flags describe.

    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser)
    >>> request = request_from_args(parser.parse_args(["--model", "gpt2", "--mesh", "8", "--planner", "ilp", "--offload", "auto"]))
    >>> request.planner, request.offload, request.global_batch
    (<PlannerName.ILP: 'ilp'>, None, None)
    """
    workload = workload_from_args(args)
    sizes = {"seq_len": args.seq_len, "global_batch": args.global_batch} | serving_sizes(args)
    return plan_request(model=args.model, mesh=args.mesh, devices=args.devices, hardware=args.hardware,
                        devices_per_node=args.devices_per_node, memory_reserve_gib=args.memory_reserve_gib,
                        **sizes, **workload, **optimizer_from_args(args), tokens=args.tokens, run=run_settings(args),
                        stack=stack_from_args(args), attention=args.attention, precision=args.precision,
                        offload=None if args.offload == "auto" else args.offload,
                        offload_activations=args.offload_activations, pins=pins_from_args(args),
                        planner=args.planner, time_limit_s=args.time_limit_s, seed=args.seed)


@dataclass(frozen=True)
class Shown:
    """What a renderer prints besides the plan."""

    plan_time_s: float  # the planning's wall time, for the summary's title
    html_page: str | None  # the HTML report, with --format html
    html_written: bool  # --out took the HTML report, so it is not printed


def _print_html(result: Plan, shown: Shown) -> None:
    if not shown.html_written:
        print(shown.html_page, end="")


Renderer = Callable[[Plan, Shown], None]
FORMATS: dict[str, Renderer] = {  # --format's choices, in the help's order
    "summary": lambda result, shown: Console().print(*summary(result, plan_time_s=shown.plan_time_s)),
    "json": lambda result, shown: print(result.model_dump_json()),
    "specs": lambda result, shown: print(json.dumps(result.param_specs, indent=1)),
    "maxtext": lambda result, shown: print(json.dumps(exports.to_maxtext(result), indent=1)),
    "megatron": lambda result, shown: print(exports.megatron_command_line(result), end=""),
    "deepspeed": lambda result, shown: print(json.dumps(exports.to_deepspeed(result), indent=1)),
    "torchtitan": lambda result, shown: print(exports.to_torchtitan_toml(result), end=""),
    "flax": lambda result, shown: print(json.dumps(exports.flax_logical_rules(result), indent=1)),
    "markdown": lambda result, shown: print(exports.markdown_report(result), end=""),
    "html": _print_html,
}


# The stacks a launcher export is planned on: the first replaces the default ``--stack jax``;
# a --stack outside the list is refused, as the plan would be costed for another program.
FORMAT_STACKS = {"maxtext": ("maxtext",), "megatron": ("megatron-core", "megatron-lm-2022", "megatron-lm-2021"),
                 "deepspeed": ("deepspeed", "megatron-deepspeed"), "torchtitan": ("torchtitan", "torchtitan-compile")}


def format_stack(args: argparse.Namespace, fmt: str) -> None:
    """Set ``args.stack`` to the stack ``--format fmt`` launches (when --stack is the default jax).

    >>> args = argparse.Namespace(stack="jax")
    >>> format_stack(args, "maxtext"); args.stack
    'maxtext'
    """
    stacks = FORMAT_STACKS.get(fmt)
    if stacks is None or args.stack in stacks:
        return
    if args.stack != "jax":
        raise InvalidConfigError(f"--format {fmt} exports a plan for {' or '.join(stacks)}, but --stack is {args.stack}",
                                 fix=f"drop --stack (the plan is then made on {stacks[0]}) or use --format json")
    args.stack = stacks[0]


def _html(result: Plan, args: argparse.Namespace) -> str:
    """The HTML report, with the pipeline timeline simulated again for the chosen layout."""
    cluster = load_hardware(args.hardware, devices_per_node=args.devices_per_node).with_memory_reserve(
        None if args.memory_reserve_gib is None else args.memory_reserve_gib * _GIB)
    estimate = simulate(result.model, result.train, result.layout, train_machine(cluster, result.train), keep_timeline=True)
    return html_report(result, devices_per_node=cluster.devices_per_node, timeline=estimate.timeline)


def check_out(path: Path, *, force: bool) -> None:
    """Refuse an ``--out`` that would replace a file without ``--force``, or that cannot be written at all."""
    if path.is_dir():
        raise InvalidConfigError(f"{path} is a directory", fix="give --out a file name, e.g. plan.json")
    if path.exists() and not force:
        raise InvalidConfigError(f"{path} already exists", fix="choose another --out or add --force")
    if not path.absolute().parent.is_dir():
        raise InvalidConfigError(f"cannot write {path}: directory {path.absolute().parent} does not exist",
                                 fix="create it or choose another --out")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so no half-written file is left."""
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the plan from others, unlike a plain open()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_settings(args: argparse.Namespace) -> RunSettings:
    """The checkpoint interval and loader of ``--checkpoint-every-s`` and ``--loader``."""
    return RunSettings(checkpoint_every_s=args.checkpoint_every_s, loader_prefetch=args.loader == "prefetch")


def training_time_rows(run: RunOverheads, *, tokens_per_s: float, mfu: float, device_hours: float) -> list[tuple[str, str]]:
    """The time to train and its parts, each with what it assumed."""
    tokens = run.steps_s * tokens_per_s
    loader = "prefetching loader: only reads slower than the step add" if run.loader_prefetch else "blocking loader: every read adds"
    return [
        ("time to train", f"{run.total_s / 86400:,.1f} days, {device_hours:,.0f} device-hours for {tokens:.3g} tokens"),
        ("  steps", f"{run.steps_s / 86400:,.1f} days   (at this plan's predicted MFU {mfu:.1%}, {tokens_per_s:,.0f} tokens/s)"),
        ("  input pipeline", f"{run.input_overhead_s / 3600:,.2f} h   ({run.input_bytes_per_s / 1e6:,.1f} MB/s of {run.token_bytes}-byte "
                             f"token IDs needed, storage reads {run.read_bytes_per_s / 1e9:,.0f} GB/s; {loader})"),
        ("  checkpoints", f"{run.checkpoint_overhead_s / 3600:,.2f} h   ({run.n_checkpoints:,} × {run.checkpoint_bytes / 1e9:,.0f} GB "
                          f"of master weights and optimizer moments, one every {run.checkpoint_every_s:g} s, "
                          f"{run.checkpoint_write_s:,.1f} s each at {run.write_bytes_per_s / 1e9:,.0f} GB/s, training waits)"),
        ("  storage", run.storage),
    ]


def summary(p: Plan, *, plan_time_s: float) -> list[Table]:
    """Rich tables: mesh axes, prediction and memory, alternatives; the run's wall time in the title."""
    est, lay, mem, b = p.predicted, p.layout, p.predicted.memory, p.predicted.breakdown
    axes = Table(title=f"{p.model.name}{titled_workload(p.train)} on {lay.n_devices}× {p.hardware}: plan found in {plan_time_s:.2f} s "
                       f"({p.solver.planner}, {p.solver.status}, {p.solver.evaluated} layouts costed)")
    for col in ("mesh axis", "size", "carries", "links"):
        axes.add_column(col)
    for a in p.mesh:
        axes.add_row(a.name, str(a.size), a.parallelism, " + ".join(a.links) or "-")
    chunks = f" · {lay.interleave} chunks per stage" if lay.interleave > 1 else ""
    chunks += f" · layers per stage {'/'.join(map(str, lay.stage_layers))}" if lay.stage_layers else ""
    training_terms = (f" · micro-batch {lay.micro_batch} · {lay.recompute} recompute · ZeRO {lay.zero_stage}"
                      f"{' · sequence parallel' if lay.sequence_parallel else ''}"
                      f"{OFFLOADED.get(lay.offload, '')}{' · activations offloaded' if lay.offload_activations else ''}")
    serving_terms = f" · {lay.dp} replica(s) of {lay.tp * lay.pp} device(s)"
    pred = Table(title=f"{lay.degrees_text}{chunks}{training_terms if p.train.workload.runs_backward else serving_terms}",
                 show_header=False)
    pred.add_column()
    pred.add_column(overflow="fold")  # flags a user copies must not be cut short
    training_rows = (
        ("step time", f"{est.step_time_s:.3f} s   ({est.tokens_per_s:,.0f} tokens/s)"),
        utilisation_row(est),
        ("  compute / memory-bound / recompute", f"{b.compute_s:.3f} / {b.memory_bound_s:.3f} / {b.recompute_s:.3f} s"),
        ("  bubble / exposed comm / optimizer", f"{b.bubble_s:.3f} / {b.exposed_comm_s:.3f} / {b.optimizer_s:.3f} s"),
        memory_total_row(mem),
        *memory_rows(mem, lora=not p.train.workload.trains_base_weights, digits=1),
        *offload_rows(est, reason=p.solver.offload_reason),
        *((("loss in pieces", f"{lay.stack.cross_entropy_chunks} pieces (--cross-entropy-chunks) because "
            f"{p.solver.loss_pieces_reason}"),) if p.solver.loss_pieces_reason else ()),
        *filter(None, [jax_memory_row(mem), xla_flags_row(lay, p.hardware)]),
    ) if p.train.workload.runs_backward else ()
    if p.solver.pins:
        pred.add_row("pinned", f"{p.solver.pins.flags}   (the planner chose the rest)")
    for name, value in training_rows or serving_rows(p):
        pred.add_row(name, value)
    for note in p.model_notes:
        pred.add_row("model", note)
    if p.batch:
        pred.add_row("batch", f"{p.batch.sequences:,} × {p.train.seq_len} = {p.batch.tokens / 1e6:,.3g} M tokens   ({p.batch.reason})")
        if p.batch.warning:
            pred.add_row("  warning", p.batch.warning)
    if p.train.workload.adapters(p.model):
        trained = p.train.workload.trainable_params(p.model)
        pred.add_row("workload", f"{workload_label(p.train)}: {trained / 1e6:,.1f} M adapter parameters train "
                                 f"({trained / p.model.total_params:.2%} of {p.model.total_params / 1e9:.2f} B); the frozen weights "
                                 "have no gradients or optimizer state, and their backward computes input gradients only")
    if est.run_overheads is not None:
        for name, value in training_time_rows(est.run_overheads, tokens_per_s=est.tokens_per_s, mfu=est.mfu,
                                              device_hours=est.device_hours):
            pred.add_row(name, value)
    if p.solver.intra_op:
        ilp = p.solver.intra_op
        effort = (f"{ilp.variables:,} variables, gap {ilp.gap:.1%}" if ilp.gap is not None
                  else f"{ilp.evaluations:,} evaluations, no bound")
        pred.add_row(f"intra-op {ilp.planner}", f"{ilp.status} over {', '.join(ilp.axes)} ({ilp.free_nodes} decisions, {effort})")
    if not p.alternatives:
        return [axes, pred]
    alts = Table(title="alternatives")
    for col in ("layout", p.train.workload.step_time_label, "why not"):
        alts.add_column(col)
    for alt in p.alternatives:
        a = alt.layout
        alts.add_row(f"{a.degrees_text} v{a.interleave} mb{a.micro_batch} {a.recompute} z{a.zero_stage}"
                     if p.train.workload.runs_backward else a.degrees_text,
                     f"{alt.step_time_s:.3f} s" if p.train.workload.runs_backward else f"{alt.step_time_s * 1e3:.2f} ms", alt.why)
    return [axes, pred, alts]
