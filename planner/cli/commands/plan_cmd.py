"""``plan --model M --mesh 8x4``: choose a layout, print it and why; optionally write it."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidConfigError
from costmodel.step.estimate import StepEstimate
from costmodel.inputs.layout import Offload
from costmodel.step.memory import MemoryBreakdown
from costmodel.step.run_overheads import DEFAULT_CHECKPOINT_EVERY_S, RunOverheads, RunSettings
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.inputs.workload import WorkloadKind, adapter_params_per_layer
from planner.cli.commands.arg_types import PRECISION_HELP, non_negative_int, positive_float, positive_int
from planner.cli.commands.stack_args import add_stack_arguments, stack_from_args
from planner.cli.commands.workload_args import add_workload_arguments, serving_sizes, workload_from_args
from planner.cli.progress import progress_display, wanted
from planner.plan_schema import Plan

_GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name or config.json path")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--mesh", help="device mesh, e.g. 8x4 or data=8,tensor=4")
    where.add_argument("--devices", type=positive_int, help="device count; the planner chooses the mesh")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile name or JSON path (default h100-sxm)")
    parser.add_argument("--devices-per-node", type=positive_int, help="override the profile's devices per node")
    parser.add_argument("--seq-len", type=positive_int,
                        help="tokens per sequence (default 2048, or the model's learned positions if fewer)")
    parser.add_argument("--global-batch", type=positive_int, default=256, help="sequences per step (default 256)")
    parser.add_argument("--tokens", type=positive_float,
                        help="training tokens, e.g. 15e12: also predict days to train and device-hours at the plan's step time, "
                             "with the input pipeline's stalls and the checkpoint writes")
    parser.add_argument("--checkpoint-every-s", type=positive_float, default=DEFAULT_CHECKPOINT_EVERY_S,
                        help="with --tokens: seconds of training between checkpoints (default 3600)")
    parser.add_argument("--loader", choices=["prefetch", "blocking"], default="prefetch",
                        help="with --tokens: prefetch (reads overlap the step; default) or blocking (each step waits for its read)")
    # Checked by planner.api, so an unknown name gets the error catalog's one line.
    parser.add_argument("--planner", default="grid",
                        help="grid: layout search with Megatron sharding rules (default); ilp: the same search, then the "
                             "CP-SAT intra-op ILP shards every parameter and op of a stage; anneal/beam/random: search "
                             "planners on the ILP's strategy space")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default="bf16",
                        help=PRECISION_HELP)
    parser.add_argument("--offload", choices=["auto", *(o.value for o in Offload)], default="auto",
                        help="optimizer state on host memory, Adam on the CPU (ZeRO-Offload): auto (only when no layout fits "
                             "without; default), none or optimizer")
    add_workload_arguments(parser)
    add_stack_arguments(parser)
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed of a search planner (default 0)")
    parser.add_argument("--time-limit-s", type=positive_float, default=20.0,
                        help="limit of the layout search and, separately, of the intra-op planner; when it runs out the best "
                             "plan found is kept and solver.status says FEASIBLE (default 20)")
    parser.add_argument("--format", choices=["summary", "json", "specs", "maxtext", "flax", "markdown", "html"], default="summary",
                        help="what to print: rich summary, Plan JSON, parameter specs, MaxText overrides, Flax logical axis "
                             "rules, Markdown report, or a self-contained HTML report (with --out, written there instead of the JSON)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (same as --format json)")
    parser.add_argument("--out", help="also write the plan JSON (with --format html: the HTML report) to this file "
                                      "(atomically; the same inputs give the same bytes)")
    parser.add_argument("--force", action="store_true", help="let --out replace an existing file")


def run(args: argparse.Namespace) -> int:
    from planner.api import plan
    from planner.cli.exports import flax_logical_rules, markdown_report, to_maxtext

    if args.out:
        check_out(Path(args.out), force=args.force)  # before planning, which may take a while
    fmt = "json" if args.json else args.format
    workload = workload_from_args(args)
    start = time.perf_counter()
    with progress_display(enabled=wanted(fmt)) as report:
        sizes = {"seq_len": args.seq_len, "global_batch": args.global_batch} | serving_sizes(args)
        result = plan(args.model, mesh=args.mesh, devices=args.devices, hardware=args.hardware, **sizes,
                      devices_per_node=args.devices_per_node, planner=args.planner,
                      time_limit_s=args.time_limit_s, seed=args.seed, progress=report, tokens=args.tokens, run=run_settings(args),
                      stack=stack_from_args(args), attention=args.attention, precision=args.precision,
                      offload=None if args.offload == "auto" else args.offload, **workload)
    plan_time_s = time.perf_counter() - start
    page = _html(result, args) if fmt == "html" else None
    if args.out:
        try:
            write_atomic(Path(args.out), page or result.model_dump_json(indent=1) + "\n")
        except OSError as err:
            raise InvalidConfigError(f"cannot write {args.out}: {err.strerror or err}",
                                     fix="check the directory's permissions and free space") from err
    if fmt == "json":
        print(result.model_dump_json())
    elif fmt == "specs":
        print(json.dumps(result.param_specs, indent=1))
    elif fmt == "maxtext":
        print(json.dumps(to_maxtext(result), indent=1))
    elif fmt == "flax":
        print(json.dumps(flax_logical_rules(result), indent=1))
    elif fmt == "markdown":
        print(markdown_report(result), end="")
    elif fmt == "html":
        if not args.out:
            print(page, end="")
    else:
        Console().print(*summary(result, plan_time_s=plan_time_s))
    return 0


def _html(result: Plan, args: argparse.Namespace) -> str:
    """The HTML report, with the pipeline timeline simulated again for the chosen layout."""
    from costmodel.hardware.profile import load_hardware
    from costmodel.hardware.machine import train_machine
    from costmodel.step.simulator import simulate
    from planner.cli.html_report import html_report

    cluster = load_hardware(args.hardware, devices_per_node=args.devices_per_node)
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


def workload_label(train: TrainConfig) -> str:
    """``pretrain``, or LoRA's or serving's settings in a few words.

    >>> workload_label(TrainConfig(workload="finetune-lora"))
    'finetune-lora: rank 16 on attn, frozen weights bf16'
    >>> workload_label(TrainConfig(workload="decode", global_batch=64, seq_len=4096))
    'decode: batch 64, context 4096, weights bf16'
    """
    if train.is_inference:
        inf = train.inference
        prompt = f", prompt {train.prompt_len}" if train.prompt_len != train.seq_len else ""
        return f"{train.workload.value}: batch {train.global_batch}, context {train.seq_len}{prompt}, weights {inf.weight_dtype.value}"
    if not train.is_lora:
        return train.workload.value
    lora = train.lora
    return f"{train.workload.value}: rank {lora.rank} on {lora.target_label}, frozen weights {lora.frozen_dtype.value}"


def titled_workload(train: TrainConfig) -> str:
    """`` (workload ..., precision)`` after a model's name in a title; nothing for bf16 pretraining, the default.

    >>> titled_workload(TrainConfig().with_precision(Precision.FP8))
    ' (fp8)'
    """
    parts = [workload_label(train)] if train.workload is not WorkloadKind.PRETRAIN else []
    parts += [train.precision.value] if train.precision is not Precision.BF16 else []
    return f" ({', '.join(parts)})" if parts else ""


def memory_rows(mem: MemoryBreakdown, *, lora: bool, digits: int, state: str = "params / grads / optimizer") -> list[tuple[str, str]]:
    """The memory breakdown's rows of a summary, in GiB; LoRA's frozen weights, adapters and their state apart."""
    def gib(*values: float) -> str:
        return " / ".join(f"{v / _GIB:.{digits}f}" for v in values) + " GiB"

    row = (("  frozen weights / adapters / grads / optimizer",
            gib(mem.frozen_params_bytes, mem.params_bytes - mem.frozen_params_bytes, mem.grads_bytes, mem.optimizer_bytes))
           if lora else (f"  {state}", gib(mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes)))
    return [row, ("  activations / temporary", gib(mem.activations_bytes, mem.temporary_bytes))]


def serving_rows(p: Plan) -> list[tuple[str, str]]:
    """The summary rows of a serving plan: latencies, throughput, memory with the KV cache, why this layout."""
    est, mem, srv, train = p.predicted, p.predicted.memory, p.predicted.serving, p.train
    lay = p.layout
    bound_ms = train.inference.max_token_latency_ms
    decode = train.workload is WorkloadKind.DECODE
    rivals = [a for a in p.alternatives if "over the" in a.why]
    if decode and rivals:
        why = (f"latency-bound: dp{rivals[0].layout.dp} tp{rivals[0].layout.tp} pp{rivals[0].layout.pp} would serve more tokens/s "
               f"but takes {rivals[0].step_time_s * 1e3:.2f} ms per token, over the {bound_ms:g} ms bound")
    else:
        why = (f"throughput: the most {'output' if decode else 'prompt'} tokens/s of the layouts that fit"
               + (f", within {bound_ms:g} ms per token" if bound_ms else ""))
    return [
        ("time per output token", f"{est.time_per_output_token_s * 1e3:.2f} ms   ({srv.decode_bound}-bound; HBM floor "
                                  f"{srv.hbm_lower_bound_s * 1e3:.2f} ms; {srv.micro_batches} micro-batch(es) per replica)"),
        ("  compute / HBM / tp all-reduce / pp hand-off", f"{srv.decode_compute_s * 1e3:.2f} / {srv.decode_hbm_s * 1e3:.2f} / "
                                                       f"{srv.decode_tp_comm_s * 1e3:.2f} / {srv.decode_pp_handoff_s * 1e3:.2f} ms"),
        ("time to first token", f"{est.time_to_first_token_s * 1e3:.1f} ms   (prefill of {train.global_batch} × "
                                f"{train.prompt_len} tokens per replica)"),
        ("tokens/s", f"{est.tokens_per_s:,.0f} {'output' if decode else 'prompt'} tokens/s over {lay.dp} replica(s)"),
        ("memory per device", f"{mem.total_bytes / _GIB:.1f} GiB of {mem.hbm_bytes / _GIB:.0f} GiB"),
        ("  weights / KV cache / activations + temporary", f"{mem.params_bytes / _GIB:.2f} / {mem.kv_cache_bytes / _GIB:.2f} / "
                                                          f"{(mem.activations_bytes + mem.temporary_bytes) / _GIB:.2f} GiB"),
        ("why this layout", why),
    ]


def offload_rows(est: StepEstimate, *, reason: str | None) -> list[tuple[str, str]]:
    """With offloading: why, what it costs per step, and the host memory it takes, itemised."""
    off, host = est.breakdown.offload, est.memory.host
    if off is None or host is None:
        return []
    why = f"optimizer state on the host because {reason}" if reason else "optimizer state on the host (--offload optimizer)"
    capacity = f" of {host.capacity_bytes / _GIB:,.0f} GiB (this device's share of the node)" if host.capacity_bytes else ""
    return [
        ("offload", f"{why}; costs {off.exposed_transfer_s:.3f} s/step of PCIe and {off.cpu_adam_s:.3f} s of CPU Adam"),
        ("  device↔host", f"{(off.grads_to_host_bytes + off.grads_from_host_bytes + off.params_to_device_bytes) / 1e9:,.1f} GB "
                         f"a step at {off.link_bytes_per_s / 1e9:.1f} GB/s = {off.transfer_s:.3f} s, {off.exposed_transfer_s:.3f} s "
                         "exposed (gradients run behind backward, parameters go up after Adam)"),
        ("host memory", f"{host.total_bytes / _GIB:,.1f} GiB{capacity}"),
        ("  master / moments / grads / 16-bit copy / accumulators",
         " / ".join(f"{v / _GIB:.1f}" for v in (host.master_weights_bytes, host.moments_bytes, host.grads_bytes,
                                                 host.param_copy_bytes, host.accumulated_grads_bytes)) + " GiB"),
    ]


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
    pred = Table(title=f"dp{lay.dp} tp{lay.tp} pp{lay.pp}{chunks} · micro-batch {lay.micro_batch} · {lay.recompute} recompute · "
                       f"ZeRO {lay.zero_stage}{' · sequence parallel' if lay.sequence_parallel else ''}"
                       f"{' · optimizer offloaded' if lay.offload is Offload.OPTIMIZER else ''}", show_header=False)
    for name, value in serving_rows(p) if p.train.is_inference else (
        ("step time", f"{est.step_time_s:.3f} s   (MFU {est.mfu:.1%}, {est.tokens_per_s:,.0f} tokens/s)"),
        ("  compute / memory-bound / recompute", f"{b.compute_s:.3f} / {b.memory_bound_s:.3f} / {b.recompute_s:.3f} s"),
        ("  bubble / exposed comm / optimizer", f"{b.bubble_s:.3f} / {b.exposed_comm_s:.3f} / {b.optimizer_s:.3f} s"),
        ("memory per device", f"{mem.total_bytes / _GIB:.1f} GiB of {mem.hbm_bytes / _GIB:.0f} GiB"),
        *memory_rows(mem, lora=p.train.is_lora, digits=1),
        *offload_rows(est, reason=p.solver.offload_reason),
    ):
        pred.add_row(name, value)
    if p.train.is_lora:
        trained = p.model.num_layers * adapter_params_per_layer(p.model, p.train.lora)
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
    alts = Table(title="alternatives")
    for col in ("layout", "per output token" if p.train.workload is WorkloadKind.DECODE else "step time", "why not"):
        alts.add_column(col)
    for alt in p.alternatives:
        a = alt.layout
        alts.add_row(f"dp{a.dp} tp{a.tp} pp{a.pp} v{a.interleave} mb{a.micro_batch} {a.recompute} z{a.zero_stage}",
                     f"{alt.step_time_s * 1e3:.2f} ms" if p.train.is_inference else f"{alt.step_time_s:.3f} s", alt.why)
    return [axes, pred, alts]
