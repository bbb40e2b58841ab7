"""`inspect_model`: what a model costs before any layout is chosen.

>>> from planner.config import load_model
>>> report = inspect_model(load_model("gpt2"), TrainConfig(seq_len=128, global_batch=2))
>>> report.params, report.vocab_size, report.padded_vocab_size, report.ops > 0
(124475904, 50257, 50304, True)
>>> inspect_model(load_model("gpt2"), TrainConfig(seq_len=128, global_batch=2, workload="finetune-lora")).trainable_params
1179648
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.oplevel.opgraph import ops, primitive_counts, total_bytes_accessed, total_flops
from planner.intraop.extract import extract_graph
from planner.programs.train_step import abstract_train_inputs, make_train_step


class InspectReport(BaseModel):
    """Sizes and costs of one training step of a model, before parallelisation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="Model name.")
    workload: str = Field("pretrain", description="pretrain, finetune-full or finetune-lora (the step traced).")
    params: int = Field(description="Total parameters.")
    trainable_params: int = Field(description="Parameters the step trains: all, or under LoRA the adapters.")
    embedding_params: int = Field(description="Token/position embeddings and an untied head, over the padded vocabulary.")
    vocab_size: int = Field(description="Tokens of the vocabulary (the tokenizer's).")
    padded_vocab_size: int = Field(description="Rows of the embedding table and columns of the head: the vocabulary padded "
                                               "to a multiple of the model's vocab_multiple (`ModelConfig.padded_vocab_size`).")
    params_per_layer: int = Field(description="Parameters of one transformer layer.")
    layers: int = Field(description="Transformer layers.")
    seq_len: int = Field(description="Tokens per sequence.")
    global_batch: int = Field(description="Sequences per step.")
    flops_per_step: float = Field(description="FLOPs of one training step from the graph (forward, backward, optimizer).")
    matmul_flops_per_step: float = Field(description="The dot_general part of flops_per_step (what analytic counts count).")
    flops_per_token: float = Field(description="flops_per_step / tokens per step.")
    bytes_accessed_per_step: float = Field(description="Bytes read and written by all ops, unfused.")
    ops: int = Field(description="Operations in the extracted graph (a scanned layer counted once).")
    extract_time_s: float = Field(description="Seconds to trace the train step and build the graph.")
    top_primitives: dict[str, int] = Field(description="The most frequent primitives and their node counts.")


def inspect_model(cfg: ModelConfig, train: TrainConfig) -> InspectReport:
    """Trace ``cfg``'s full training step on abstract inputs and summarise it."""
    start = time.perf_counter()
    g = extract_graph(make_train_step(cfg, train), *abstract_train_inputs(cfg, train), name=cfg.name)
    extract_time_s = time.perf_counter() - start
    counts = primitive_counts(g)
    flops = total_flops(g)
    return InspectReport(
        model=cfg.name,
        workload=train.workload.kind,
        params=cfg.total_params,
        trainable_params=round(train.workload.trainable_params(cfg)),
        embedding_params=cfg.embedding_params,
        vocab_size=cfg.vocab_size,
        padded_vocab_size=cfg.padded_vocab_size,
        params_per_layer=cfg.params_per_layer,
        layers=cfg.num_layers,
        seq_len=train.seq_len,
        global_batch=train.global_batch,
        flops_per_step=flops,
        matmul_flops_per_step=float(sum(op.flops * op.repeat for op in ops(g) if op.primitive == "dot_general")),
        flops_per_token=flops / train.tokens_per_step,
        bytes_accessed_per_step=total_bytes_accessed(g),
        ops=sum(counts.values()),
        extract_time_s=extract_time_s,
        top_primitives=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8]),
    )
