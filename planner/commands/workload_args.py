"""``--workload`` and LoRA's flags, shared by ``plan``, ``plan simulate`` and ``plan inspect``.

>>> parser = argparse.ArgumentParser()
>>> add_workload_arguments(parser)
>>> workload_from_args(parser.parse_args(["--workload", "finetune-lora", "--lora-targets", "attn,mlp"]))["lora"].targets
(<LoraTarget.ATTN: 'attn'>, <LoraTarget.MLP: 'mlp'>)
"""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.errors import InvalidConfigError
from costmodel.workload import FrozenDtype, LoraConfig, LoraTarget, WorkloadKind
from planner.commands.arg_types import positive_int

_LORA_FLAGS = ("lora_rank", "lora_targets", "frozen_dtype")


def lora_targets(text: str) -> tuple[LoraTarget, ...]:
    """``attn`` or ``attn,mlp`` (any order) as target groups."""
    names = [t.strip() for t in text.split(",")]
    known = [t.value for t in LoraTarget]
    bad = [n for n in names if n not in known]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} is not a LoRA target group; fix: use {' or '.join(known)}, e.g. attn,mlp")
    return tuple(LoraTarget(n) for n in names)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=[w.value for w in WorkloadKind], default=WorkloadKind.PRETRAIN.value,
                        help="pretrain (default), finetune-full (the same step: every weight trains) or finetune-lora "
                             "(frozen base, trained low-rank adapters)")
    parser.add_argument("--lora-rank", type=positive_int, help="LoRA adapter rank (default 16; finetune-lora only)")
    parser.add_argument("--lora-targets", type=lora_targets,
                        help="matrices with adapters: attn (q, k, v, o; the default) or attn,mlp (finetune-lora only)")
    parser.add_argument("--frozen-dtype", choices=[d.value for d in FrozenDtype],
                        help="storage of the frozen base weight matrices: bf16 (default), or int8 / int4 weight-only "
                             "as QLoRA stores them (finetune-lora only)")


def workload_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``{"workload": ..., "lora": LoraConfig | None}`` for `planner.config.train_config`; LoRA
    flags with another workload are refused in one line."""
    given = {flag: getattr(args, flag) for flag in _LORA_FLAGS if getattr(args, flag) is not None}
    if args.workload != WorkloadKind.FINETUNE_LORA:
        if given:
            flag = next(iter(given)).replace("_", "-")
            raise InvalidConfigError(f"--{flag} applies to --workload finetune-lora, not {args.workload}",
                                     fix="add --workload finetune-lora or drop the flag")
        return {"workload": args.workload, "lora": None}
    settings = {"rank": given.get("lora_rank"), "targets": given.get("lora_targets"), "frozen_dtype": given.get("frozen_dtype")}
    return {"workload": args.workload, "lora": LoraConfig(**{k: v for k, v in settings.items() if v is not None})}
