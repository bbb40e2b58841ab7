"""Workloads as types: what one step does with the model, one module each.

`Workload` is the discriminated union of the workload types on their ``kind`` (the ``--workload``
name); the cost model asks the object (`costmodel.workloads.base.WorkloadBase`) for its terms and
never tests which one it holds. Adding a workload is adding a module here and its type to `Workload`
(and, to be lowered, its entry in `validate.workload_programs`).

>>> workload_of("finetune-lora", lora={"rank": 8}).adapter_rank
8
>>> workload_of("decode").kind, [w for w in WORKLOAD_KINDS]
('decode', ['pretrain', 'finetune-full', 'finetune-lora', 'prefill', 'decode'])
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from costmodel.workloads.base import WorkloadBase
from costmodel.workloads.lora import LoraFinetune
from costmodel.workloads.serving import Decode, Prefill, ServingWorkload
from costmodel.workloads.training import FullFinetune, Pretrain

Workload = Annotated[Pretrain | FullFinetune | LoraFinetune | Prefill | Decode, Field(discriminator="kind")]

_TYPES: tuple[type[WorkloadBase], ...] = (Pretrain, FullFinetune, LoraFinetune, Prefill, Decode)
WORKLOAD_KINDS: tuple[str, ...] = tuple(t.model_fields["kind"].default for t in _TYPES)
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Workload)

# The settings each workload type takes, by the name plan files before the typed workloads used (beside ``workload``).
_SETTINGS = {"lora": ("finetune-lora",), "inference": ("prefill", "decode")}
_SETTINGS_FIELD = {"lora": "lora", "inference": "serving"}
_APPLIES = {"lora": "finetune-lora only", "inference": "prefill and decode only"}


def workload_type(kind: str) -> type[WorkloadBase]:
    """The type of the workload named ``kind`` (its ``--workload`` name).

    >>> workload_type("decode").runs_backward
    False
    """
    return dict(zip(WORKLOAD_KINDS, _TYPES))[str(kind)]


def workload_of(kind: str, *, lora: Any = None, inference: Any = None) -> WorkloadBase:
    """The workload ``kind`` with its settings given as plan files before the typed workloads held them
    (``lora`` for finetune-lora, ``inference`` for prefill and decode); settings for another workload are a ``ValueError``.

    >>> workload_of("pretrain", lora={"rank": 8})
    Traceback (most recent call last):
    ValueError: LoRA settings given for workload pretrain; they apply to finetune-lora only
    """
    kind = str(kind)
    data: dict[str, Any] = {"kind": kind}
    for name, value in (("lora", lora), ("inference", inference)):
        if value is None:
            continue
        if kind not in _SETTINGS[name]:
            label = "LoRA settings" if name == "lora" else "serving settings"
            raise ValueError(f"{label} given for workload {kind}; they apply to {_APPLIES[name]}")
        data[_SETTINGS_FIELD[name]] = value
    return _ADAPTER.validate_python(data)


__all__ = ["WORKLOAD_KINDS", "Decode", "FullFinetune", "LoraFinetune", "Prefill", "Pretrain", "ServingWorkload", "Workload",
           "WorkloadBase", "workload_of", "workload_type"]
