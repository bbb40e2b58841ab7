"""The work around the step that a time to train counts: the input pipeline and checkpoints.

Input: the loader reads pre-tokenized token IDs from the cluster's shared storage
(`costmodel.hardware.storage`), ``token_bytes`` each (Megatron's indexed datasets store uint16
below a 65 500-token vocabulary, int32 above: ``DType.optimal_dtype`` in
megatron/core/datasets/indexed_dataset.py). Reading one step's tokens takes ``loader_s``;
a prefetching loader overlaps that with the step and adds only what exceeds the step
(``max(0, loader_s − step_s)``), a blocking one adds all of it.

Checkpoints: every ``checkpoint_every_s`` of training the run writes what it needs to
resume, the master parameters and the optimizer's two moments (the compute-dtype copy is
derived from the master; LoRA saves its adapters), once over all devices (each shard
written by one replica, as Megatron-core's fully parallel save and Orbax do) at the
storage's aggregate write rate; training waits for the write (a synchronous save).

>>> run = run_overheads(tokens=1e9, tokens_per_step=2**20, step_time_s=1.0, n_devices=8, trained_params=1e9,
...                     train=TrainConfig(), vocab_size=128_256, storage=SUPERPOD_H100_STANDARD)
>>> run.checkpoint_bytes / 1e9, run.token_bytes, run.input_overhead_s
(12.0, 4, 0.0)
"""

from __future__ import annotations

import math

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, computed_field

from costmodel.hardware.storage import SUPERPOD_H100_STANDARD, StorageSpec  # noqa: F401 (the doctest's storage)
from costmodel.inputs.train_config import TrainConfig
from costmodel.record import Record

DEFAULT_CHECKPOINT_EVERY_S = 3600.0
_UINT16_VOCAB_LIMIT = 65_500  # Megatron's DType.optimal_dtype: uint16 below this cardinality, int32 above


class RunSettings(Record):
    """How the run feeds its steps and saves its state."""

    checkpoint_every_s: PositiveFloat = Field(DEFAULT_CHECKPOINT_EVERY_S, description="Seconds of training between checkpoints.")
    loader_prefetch: bool = Field(True, description="True: the loader reads the next step's tokens while this step runs.")
    token_bytes: PositiveInt | None = Field(None, description="Bytes of one stored token ID; default 2 below a 65 500-token "
                                                              "vocabulary, else 4.")


class RunOverheads(Record):
    """Time to train itemised: the steps, the input pipeline's stalls and the checkpoint writes, with what each assumed."""

    steps_s: NonNegativeFloat = Field(description="Seconds of optimizer steps: tokens / tokens per second.")
    input_overhead_s: NonNegativeFloat = Field(description="Seconds the steps wait for the loader over the run.")
    checkpoint_overhead_s: NonNegativeFloat = Field(description="Seconds the run waits for checkpoint writes.")
    token_bytes: PositiveInt = Field(description="Bytes read per training token.")
    input_bytes_per_s: NonNegativeFloat = Field(description="Read rate the loader must sustain to keep up with the steps.")
    read_bytes_per_s: PositiveFloat = Field(description="Aggregate storage read rate of the job's devices.")
    loader_prefetch: bool = Field(description="Whether the loader overlaps reading with the step.")
    checkpoint_bytes: NonNegativeFloat = Field(description="Bytes of one checkpoint: master parameters and optimizer moments.")
    write_bytes_per_s: PositiveFloat = Field(description="Aggregate storage write rate of the job's devices.")
    checkpoint_write_s: NonNegativeFloat = Field(description="Seconds to write one checkpoint.")
    checkpoint_every_s: PositiveFloat = Field(description="Seconds of training between checkpoints.")
    n_checkpoints: NonNegativeInt = Field(description="Checkpoints written over the run.")
    storage: str = Field(description="Where the storage rates come from, 'assumed: ...' for an assumption.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_s(self) -> float:
        """Seconds to train: steps, input stalls and checkpoint writes."""
        return self.steps_s + self.input_overhead_s + self.checkpoint_overhead_s


def token_bytes_for(vocab_size: int) -> int:
    """Bytes of a stored token ID for a vocabulary: 2 (uint16) below 65 500 tokens, else 4.

    >>> token_bytes_for(50_257), token_bytes_for(128_256)
    (2, 4)
    """
    return 2 if vocab_size < _UINT16_VOCAB_LIMIT else 4


def checkpoint_bytes(trained_params: float, train: TrainConfig) -> float:
    """Bytes to resume training: each trained parameter's master copy and its two optimizer moments.

    >>> checkpoint_bytes(1e9, TrainConfig()) / 1e9  # fp32 master + two fp32 Adam moments
    12.0
    >>> checkpoint_bytes(1e9, TrainConfig(optimizer_state="8bit")) / 1e9  # bf16 weights + two int8 moments and their absmax
    4.00390625
    """
    return trained_params * (train.param_dtype.bytes + train.moment_bytes_per_param)


def run_overheads(*, tokens: float, tokens_per_step: int, step_time_s: float, n_devices: int, trained_params: float,
                  train: TrainConfig, vocab_size: int, storage: StorageSpec, settings: RunSettings | None = None) -> RunOverheads:
    """The time to train ``tokens`` at ``step_time_s`` per step of ``tokens_per_step``, with its input and checkpoint overheads."""
    settings = settings or RunSettings()
    n_steps = tokens / tokens_per_step
    token_bytes = settings.token_bytes or token_bytes_for(vocab_size)
    read_bytes_per_s = storage.read_bytes_per_s(n_devices=n_devices)
    loader_s = tokens_per_step * token_bytes / read_bytes_per_s
    stall_s = max(0.0, loader_s - step_time_s) if settings.loader_prefetch else loader_s
    steps_s, input_overhead_s = n_steps * step_time_s, n_steps * stall_s
    write_bytes_per_s = storage.write_bytes_per_s(n_devices=n_devices)
    ckpt_bytes = checkpoint_bytes(trained_params, train)
    write_s = ckpt_bytes / write_bytes_per_s
    # A checkpoint after every full interval of training (steps and their input stalls); none at the very end.
    n_checkpoints = math.floor((steps_s + input_overhead_s) / settings.checkpoint_every_s)
    return RunOverheads(
        steps_s=steps_s, input_overhead_s=input_overhead_s, checkpoint_overhead_s=n_checkpoints * write_s,
        token_bytes=token_bytes, input_bytes_per_s=tokens_per_step * token_bytes / step_time_s, read_bytes_per_s=read_bytes_per_s,
        loader_prefetch=settings.loader_prefetch, checkpoint_bytes=ckpt_bytes, write_bytes_per_s=write_bytes_per_s,
        checkpoint_write_s=write_s, checkpoint_every_s=settings.checkpoint_every_s, n_checkpoints=n_checkpoints,
        storage=storage.label(),
    )
