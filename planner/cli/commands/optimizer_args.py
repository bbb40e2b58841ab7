"""``--optimizer-state`` and ``--optimizer-in-backward``: how fine-tuning keeps its optimizer, shared by ``plan``
and ``plan simulate`` (`costmodel.inputs.train_config.OptimizerState`).

>>> parser = argparse.ArgumentParser()
>>> add_optimizer_arguments(parser)
>>> optimizer_from_args(parser.parse_args(["--optimizer-state", "8bit", "--optimizer-in-backward"]))
{'optimizer_state': <OptimizerState.INT8: '8bit'>, 'optimizer_in_backward': True}
"""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.inputs.train_config import OptimizerState


def add_optimizer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--optimizer-state", choices=[s.value for s in OptimizerState], default=OptimizerState.FP32.value,
                        help="fp32: fp32 master weights, gradients and Adam moments (default); bf16: pure bf16 weights, "
                             "gradients and moments, no master copy (torchtune's full fine-tuning default); 8bit: 8-bit "
                             "AdamW (bitsandbytes / torchao, int8 moments with an fp32 scale per 2048 elements) over bf16 "
                             "weights and gradients; bf16 and 8bit need --precision bf16")
    parser.add_argument("--optimizer-in-backward", action="store_true",
                        help="fuse the optimizer step into the backward pass (torchtune's optimizer_in_bwd): each gradient "
                             "is applied and freed as it is formed, so no gradient buffer is held; one micro-batch per step")


def optimizer_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as `planner.request.PlanRequest` fields (and `TrainConfig.with_optimizer_state`'s arguments)."""
    return {"optimizer_state": OptimizerState(args.optimizer_state), "optimizer_in_backward": args.optimizer_in_backward}
