"""`Layout`: the knobs Megatron and MaxText users set by hand, as one typed value.

A layout says how a training step is spread over devices (data, tensor, pipeline,
context and expert parallel degrees), how the batch is cut into micro-batches, and the
memory/time trade-offs (activation recompute, sequence parallel, ZeRO stage), and the
software stack that runs it (`costmodel.inputs.stack.SoftwareStack`).

>>> lay = Layout(dp=4, tp=8, pp=2, micro_batch=1)
>>> lay.n_devices
64
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from costmodel.errors import InvalidConfigError, InvalidPlanError
from costmodel.inputs.model_config import ModelConfig, Positions
from costmodel.inputs.stack import STACKS, SoftwareStack
from costmodel.inputs.train_config import TrainConfig


class Recompute(StrEnum):
    """Activation recomputation policy.

    ``selective`` is Korthikanti et al. 2022's (Megatron-LM): recompute the attention core
    (scores, softmax, dropout, attention·V), keep the rest. ``selective-op`` and
    ``selective-layer`` are torchtitan's selective activation checkpointing: per-op (keep
    matmul and attention outputs except every second matmul's, recompute everything else)
    and per-layer (every second layer fully checkpointed).
    """

    NONE = "none"
    SELECTIVE = "selective"
    SELECTIVE_OP = "selective-op"
    SELECTIVE_LAYER = "selective-layer"
    FULL = "full"


class Schedule(StrEnum):
    """Pipeline schedule."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Offload(StrEnum):
    """What lives in host memory (`costmodel.step.offload`): nothing; ZeRO-Offload's optimizer
    state (fp32 master weights, Adam moments and the fp32 gradients they are updated from),
    with the Adam step on the CPU; or, with ZeRO 3, every parameter's shard too (FSDP's
    ``CPUOffload(offload_params=True)``: the device holds only the units it has gathered)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    PARAMS = "params"


class Layout(BaseModel):
    """A complete parallel layout of one training step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dp: PositiveInt = Field(1, description="Data-parallel degree (replicas, or FSDP shards with zero_stage=3).")
    tp: PositiveInt = Field(1, description="Tensor-parallel degree (Megatron column/row split).")
    tp_embed: PositiveInt = Field(
        1, description="Of the tp devices, how many ways each layer weight's model dimension is split too (decode only): 1, "
        "the 1D layout (heads, MLP width and vocabulary over tp); t > 1, 2D weight-stationary (Pope et al. 2022, section "
        "3.2.2): the model dimension over t devices, heads and MLP width over tp / t, the KV cache's sequences over the t.")
    pp: PositiveInt = Field(1, description="Pipeline stages.")
    cp: PositiveInt = Field(1, description="Context-parallel degree (sequence split in attention).")
    ep: PositiveInt = Field(1, description="Expert-parallel degree; divides dp·cp, MoE only.")
    micro_batch: PositiveInt = Field(1, description="Sequences per micro-batch on one data-parallel replica.")
    interleave: PositiveInt = Field(1, description="Model chunks per pipeline device (virtual stages).")
    stage_layers: tuple[PositiveInt, ...] | None = Field(
        None, description="Layers of each pipeline stage, first to last (uneven stages); None = as even as possible.")
    schedule: Schedule = Field(Schedule.ONE_F_ONE_B, description="Pipeline schedule.")
    recompute: Recompute = Field(Recompute.NONE, description="Activation recompute policy.")
    sequence_parallel: bool = Field(False, description="Shard norm/dropout activations over tp (Megatron SP).")
    zero_stage: int = Field(0, ge=0, le=3, description="ZeRO stage: 1 optimizer, 2 +grads, 3 +params (FSDP).")
    offload: Offload = Field(Offload.NONE, description="What is held in host memory: 'none'; 'optimizer' (ZeRO-Offload: "
                             "master weights, Adam moments and fp32 gradients on the host, Adam on the CPU); or 'params' (with "
                             "ZeRO 3: FSDP's CPU offload, the parameter and gradient shards and the optimizer on the host).")
    offload_activations: bool = Field(False, description="What the backward keeps goes to host memory during the forward and "
                                      "comes back for the backward (torchtune's OffloadActivations), a layer or two on the device "
                                      "at a time; without pipeline stages.")
    stack: SoftwareStack = Field(
        default_factory=lambda: STACKS["jax"],
        description="The software that runs the layout: kernel fusion, overlap, recompute style, ZeRO behaviour "
        "(`costmodel.inputs.stack`); default the JAX program `plan validate` lowers.")

    @property
    def n_devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def zero_shards(self) -> int:
        """Ways ZeRO splits what it shards: over the data ranks, and the context ranks too where the stack
        shards over both (`SoftwareStack.zero_over_context`).

        >>> from costmodel.inputs.stack import stack_with
        >>> Layout(dp=4, cp=2, stack=stack_with("megatron-core")).zero_shards, Layout(dp=4, cp=2, stack=stack_with("jax")).zero_shards
        (8, 4)
        """
        return self.dp * (self.cp if self.stack.zero_over_context else 1)

    def layers_on_stage(self, num_layers: int, stage: int) -> int:
        """Layers pipeline stage ``stage`` runs (the even split rounds up, as Megatron requires divisibility).

        >>> Layout(pp=4, stage_layers=(7, 9, 9, 7)).layers_on_stage(32, 0), Layout(pp=4).layers_on_stage(32, 0)
        (7, 8)
        """
        return self.stage_layers[stage] if self.stage_layers else math.ceil(num_layers / self.pp)

    @property
    def degrees_text(self) -> str:
        """The parallel degrees in one word each, context and expert only where used.

        >>> Layout(dp=16, tp=4, ep=8).degrees_text, Layout(tp=64, tp_embed=8).degrees_text
        ('dp16 tp4 pp1 ep8', 'dp1 tp64=8x8 pp1')
        """
        tensor = f"tp{self.tp}" + (f"={self.tp_embed}x{self.tp // self.tp_embed}" if self.tp_embed > 1 else "")
        return (f"dp{self.dp} {tensor} pp{self.pp}" + (f" cp{self.cp}" if self.cp > 1 else "")
                + (f" ep{self.ep}" if self.ep > 1 else ""))

    def micro_batches(self, train: TrainConfig) -> int:
        """Micro-batches each pipeline processes per step (gradient accumulation steps)."""
        return train.global_batch // (self.dp * self.micro_batch)


def check_sequence(model: ModelConfig, train: TrainConfig) -> None:
    """Raise `InvalidConfigError` when sequences are longer than learned positions allow.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="gpt2", hidden_size=64, num_layers=1, num_heads=4, ffn_size=8, vocab_size=9,
    ...                 positions="learned", max_position_embeddings=1024)
    >>> check_sequence(m, TrainConfig(seq_len=2048))
    Traceback (most recent call last):
    costmodel.errors.InvalidConfigError: seq_len=2048 exceeds gpt2's 1024 learned positions; fix: use --seq-len 1024 or less
    """
    if model.positions is Positions.LEARNED and train.seq_len > model.max_position_embeddings:
        raise InvalidConfigError(
            f"seq_len={train.seq_len} exceeds {model.name}'s {model.max_position_embeddings} learned positions",
            fix=f"use --seq-len {model.max_position_embeddings} or less",
        )


def check_layout(layout: Layout, model: ModelConfig, train: TrainConfig, *, n_devices: int) -> None:
    """Raise `InvalidPlanError` naming what to change when ``layout`` cannot run.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=64, num_layers=4, num_heads=4, ffn_size=256, vocab_size=128)
    >>> check_layout(Layout(tp=3), m, TrainConfig(global_batch=8), n_devices=3)
    Traceback (most recent call last):
    costmodel.errors.InvalidPlanError: num_heads=4 is not divisible by tp=3; fix: use a tp that divides 4
    """
    check_sequence(model, train)
    if layout.n_devices != n_devices:
        raise InvalidPlanError(
            f"dp·tp·pp·cp = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = {layout.n_devices} but devices={n_devices}",
            fix="choose degrees whose product is the device count",
        )
    check_tensor_2d(layout, model, train)  # a 2D split's heads ride only tp / tp_embed devices, checked there
    one_d = layout.tp_embed == 1
    if one_d and model.num_heads % layout.tp:
        raise InvalidPlanError(f"num_heads={model.num_heads} is not divisible by tp={layout.tp}",
                               fix=f"use a tp that divides {model.num_heads}")
    if one_d and model.num_kv_heads % layout.tp and layout.tp % model.num_kv_heads:
        raise InvalidPlanError(
            f"num_kv_heads={model.num_kv_heads} and tp={layout.tp}: neither divides the other",
            fix=f"use a tp that divides or is a multiple of {model.num_kv_heads}",
        )
    if model.num_layers < layout.pp * layout.interleave:
        raise InvalidPlanError(
            f"num_layers={model.num_layers} < pp·interleave = {layout.pp * layout.interleave}",
            fix="use fewer pipeline stages or model chunks",
        )
    if train.global_batch % (layout.dp * layout.micro_batch):
        raise InvalidPlanError(
            f"global_batch={train.global_batch} is not divisible by dp·micro_batch = {layout.dp}·{layout.micro_batch}",
            fix="choose a global batch that is a multiple of dp·micro_batch",
        )
    if train.seq_len % layout.cp:
        raise InvalidPlanError(f"seq_len={train.seq_len} is not divisible by cp={layout.cp}", fix=f"use a cp that divides {train.seq_len}")
    if layout.ep > 1 and (not model.is_moe or model.num_experts % layout.ep or (layout.dp * layout.cp) % layout.ep):
        raise InvalidPlanError(
            f"ep={layout.ep} needs a MoE model whose experts ({model.num_experts}) and dp·cp ({layout.dp * layout.cp}) it divides",
            fix="use ep=1 or a divisor of both",
        )
    check_optimizer_state(layout, train)
    if layout.offload is Offload.PARAMS and (layout.zero_stage < 3 or layout.pp > 1):
        raise InvalidPlanError(f"offloading the parameters (FSDP's CPU offload) copies each ZeRO-3 shard up before its gather; "
                               f"this layout has ZeRO {layout.zero_stage}{f' and {layout.pp} pipeline stages' if layout.pp > 1 else ''}",
                               fix="use --zero 3 without pipeline stages, or --offload optimizer")
    if layout.offload_activations and layout.pp > 1:
        raise InvalidPlanError(f"offloading activations is modelled without pipeline stages; this layout has {layout.pp}",
                               fix="drop --offload-activations, or plan without pipeline stages")
    if layout.interleave > 1 and layout.pp == 1:
        raise InvalidPlanError(f"interleave={layout.interleave} needs pipeline parallelism (pp > 1)", fix="set interleave=1")
    if layout.stage_layers is not None and (len(layout.stage_layers) != layout.pp or sum(layout.stage_layers) != model.num_layers
                                            or layout.interleave > 1):
        raise InvalidPlanError(
            f"stage_layers={list(layout.stage_layers)} must give each of the pp={layout.pp} stages its layers, "
            f"{model.num_layers} in all, without interleaving", fix="drop stage_layers for an even split")


def check_tensor_2d(layout: Layout, model: ModelConfig, train: TrainConfig) -> None:
    """Refuse a 2D weight-stationary split (`Layout.tp_embed`) that cannot run: outside a decode
    step, or with degrees that do not divide the model dimension, the KV heads (so the query heads),
    the MLP width or a replica's sequences (each of the ``tp_embed`` devices keeps the cache of its
    share of them).

    >>> m = ModelConfig(name="m", hidden_size=64, num_layers=4, num_heads=4, ffn_size=256, vocab_size=128)
    >>> check_tensor_2d(Layout(tp=4, tp_embed=2), m, TrainConfig(global_batch=8))
    Traceback (most recent call last):
    costmodel.errors.InvalidPlanError: tp_embed=2 (2D weight-stationary) is a decode layout, not a pretrain one; fix: use tp_embed=1
    """
    t = layout.tp_embed
    if t == 1:
        return
    if not train.workload.splits_model_dimension:
        raise InvalidPlanError(f"tp_embed={t} (2D weight-stationary) is a decode layout, not a {train.workload.kind} one",
                               fix="use tp_embed=1")
    heads = layout.tp // t if layout.tp % t == 0 else 0
    sizes = {"hidden_size": model.hidden_size, "num_heads": model.num_heads * heads, "ffn_size": model.ffn_size * heads,
             "batch per replica": train.global_batch // layout.dp}
    if (not heads or any(n % t for n in sizes.values()) or model.num_kv_heads % heads or model.ffn_size % heads
            or model.is_moe):
        raise InvalidPlanError(f"tp={layout.tp} as tp_embed={t} × {heads or '?'} does not divide {model.name}'s model dimension "
                               f"({model.hidden_size}), KV heads ({model.num_kv_heads}), MLP width ({model.ffn_size}) and the "
                               f"{train.global_batch // layout.dp} sequences per replica (a dense model)",
                               fix="use tp_embed=1 or another split")
    if layout.pp > 1:
        raise InvalidPlanError(f"tp_embed={t} with {layout.pp} pipeline stages is not modelled", fix="use pp=1 or tp_embed=1")


def check_optimizer_state(layout: Layout, train: TrainConfig) -> None:
    """Refuse what the fine-tuning optimizer options (`TrainConfig.optimizer_state`, ``optimizer_in_backward``)
    cannot run with: the step in backward where a step accumulates gradients over micro-batches (each gradient
    is applied as soon as it is formed); the optimizer offloaded to the host (ZeRO-Offload's CPU Adam keeps
    fp32 state and steps after the backward) with either."""
    if train.optimizer_in_backward and (n_micro := layout.micro_batches(train)) > 1:
        raise InvalidPlanError(f"the optimizer step in backward applies each gradient as it is formed, so it cannot accumulate "
                               f"{n_micro} micro-batches", fix="give --micro-batch global_batch/dp (one micro-batch per step) "
                               "or drop --optimizer-in-backward")
    if layout.offload is Offload.PARAMS and train.optimizer_in_backward:
        raise InvalidPlanError("with the parameters offloaded the optimizer steps on the host after the backward, not in it",
                               fix="drop --optimizer-in-backward, or use --offload none")
    if layout.offload is Offload.OPTIMIZER and (train.optimizer_in_backward or train.optimizer_state != "fp32"):
        raise InvalidPlanError(f"the offloaded optimizer (ZeRO-Offload's CPU Adam) steps fp32 state after the backward, not "
                               f"{train.optimizer_state.value} state{' in backward' if train.optimizer_in_backward else ''}",
                               fix="use --offload none, or --optimizer-state fp32 without --optimizer-in-backward")


def stack_recompute(policy: Recompute | str, stack: SoftwareStack) -> Recompute:
    """``policy`` as ``stack`` runs it: 'selective' is that framework's own selective recompute.

    >>> from costmodel.inputs.stack import STACKS
    >>> stack_recompute("selective", STACKS["torchtitan"]), stack_recompute("full", STACKS["torchtitan"])
    (<Recompute.SELECTIVE_OP: 'selective-op'>, <Recompute.FULL: 'full'>)
    """
    policy = Recompute(policy)
    return Recompute(stack.selective_recompute.value) if policy is Recompute.SELECTIVE else policy
