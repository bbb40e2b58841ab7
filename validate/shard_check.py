"""Compile ``planner.intraop.shard``'s specs and compare the program with the prediction.

The checks ``plan validate --compile-only`` makes, for a function the user wrote, compiled as
the choice pins it (``ShardResult.jit``): per-device
memory from ``memory_analysis()`` against the predicted arguments, temporaries and outputs,
the compiled matmul FLOPs, and the collectives of the partitioned HLO per mesh axis. The caller
of ``planner.intraop.shard`` (a user, a benchmark) checks its result here; planner does not reach up.

>>> import jax, jax.numpy as jnp
>>> from planner.intraop.shard import shard
>>> x, w = jax.ShapeDtypeStruct((64, 256), jnp.float32), jax.ShapeDtypeStruct((256, 512), jnp.float32)
>>> mesh = jax.make_mesh((1,), ("data",))
>>> result = shard(lambda x, w: jnp.tanh(x @ w), x, w, mesh=mesh, hardware="a100-80gb", baselines=False)
>>> check = check_shard(result, lambda x, w: jnp.tanh(x @ w), x, w, mesh=mesh)
>>> check.compiled_arguments_bytes == (64 * 256 + 256 * 512) * 4, check.compiled_matmul_flops == 2 * 64 * 256 * 512
(True, True)
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pydantic import BaseModel, ConfigDict, Field

from planner.intraop.pinned import auto_mesh
from planner.intraop.shard import ShardResult
from validate.hlo import collectives, dot_flops


class ShardCheck(BaseModel):
    """Predicted against compiled, per device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    predicted_bytes: float = Field(description="Arguments + outputs + peak temporaries − aliased, as predicted.")
    compiled_bytes: float = Field(description="The same sum from memory_analysis().")
    compiled_arguments_bytes: float = Field(description="memory_analysis().argument_size_in_bytes.")
    compiled_temporaries_bytes: float = Field(description="memory_analysis().temp_size_in_bytes.")
    compiled_outputs_bytes: float = Field(description="memory_analysis().output_size_in_bytes.")
    compiled_matmul_flops: float = Field(description="Matmul FLOPs per device per call in the compiled module.")
    collectives: dict[str, int] = Field(description="'kind(axes)' → executions per call in the compiled module.")

    @property
    def memory_error(self) -> float:
        """(predicted − compiled) / compiled."""
        return self.predicted_bytes / self.compiled_bytes - 1 if self.compiled_bytes else 0.0


def compiled_memory(fn: Callable[..., Any], abstract_args: Sequence[Any], in_specs: Any, out_specs: Any, *, mesh: Mesh,
                    donate_argnums: Sequence[int] = ()) -> Any:
    """The compiled executable of ``fn`` with these specs on ``mesh`` (Auto or Explicit axes: compiled on its Auto twin,
    so XLA propagates the shardings between them as with the specs alone)."""
    def named(tree: Any) -> Any:
        return jax.tree.map(lambda s: NamedSharding(auto_mesh(mesh), s), tree, is_leaf=lambda x: isinstance(x, PartitionSpec))

    return jax.jit(fn, in_shardings=named(in_specs), out_shardings=named(out_specs),
                   donate_argnums=tuple(donate_argnums)).lower(*abstract_args).compile()


def check_shard(result: ShardResult, fn: Callable[..., Any], *abstract_args: Any, mesh: Mesh,
                donate_argnums: Sequence[int] = ()) -> ShardCheck:
    """Compile ``result``'s pinned program (`ShardResult.jit`) of ``fn`` on ``mesh`` and compare with its prediction."""
    compiled = result.jit(fn, *abstract_args, mesh=mesh, donate_argnums=donate_argnums).lower(*abstract_args).compile()
    m = compiled.memory_analysis()
    text = compiled.as_text()
    counts = Counter(f"{c.kind}({','.join(c.axes)})" for c in collectives(text, mesh_shape=result.mesh_axes) for _ in range(round(c.calls)))
    return ShardCheck(predicted_bytes=result.predicted_memory_bytes,
                      compiled_bytes=m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes,
                      compiled_arguments_bytes=m.argument_size_in_bytes, compiled_temporaries_bytes=m.temp_size_in_bytes,
                      compiled_outputs_bytes=m.output_size_in_bytes, compiled_matmul_flops=dot_flops(text), collectives=dict(counts))
