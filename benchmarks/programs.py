"""Training steps of models from JAX libraries installed from the package index, for ``planner.intraop.shard``.

Each builder returns a `Program`: a ``train_step(params, opt_state, tokens) -> (params,
opt_state, loss)`` with optax AdamW and next-token cross-entropy, and its abstract
arguments (``jax.eval_shape``: nothing is allocated). The models stay in their packages:
penzai's Llama-like transformer, Hugging Face transformers' Flax GPT-2 and Llama, and a
decoder of Flax linen layers with ``nn.remat`` blocks (the case the library-call issue was
filed on). ``small=True`` builds the same programs at test size.

>>> p = penzai_llama(small=True)
>>> p.name, p.parameters > 0, jax.eval_shape(p.train_step, *p.abstract_args)[2].shape
('penzai-llama', True, ())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclass(frozen=True)
class Program:
    """A training step and its abstract ``(params, opt_state, tokens)``."""

    name: str
    library: str
    train_step: Callable[..., Any]
    abstract_args: tuple[Any, ...]

    @property
    def parameters(self) -> int:
        return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(self.abstract_args[0])))


def _step(logits_fn: Callable[[Any, jax.Array], jax.Array], params: Any, batch: int, seq_len: int, name: str,
          library: str) -> Program:
    """AdamW on the mean next-token cross-entropy of ``logits_fn(params, tokens_BxS)``."""
    optimizer = optax.adamw(1e-4)

    def train_step(params: Any, opt_state: Any, tokens_BxS: jax.Array) -> tuple[Any, Any, jax.Array]:
        def loss(params: Any) -> jax.Array:
            logits_BxSxV = logits_fn(params, tokens_BxS).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits_BxSxV[:, :-1], tokens_BxS[:, 1:]).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    return Program(name=name, library=library, train_step=train_step,
                   abstract_args=(params, jax.eval_shape(optimizer.init, params), tokens))


def penzai_llama(*, small: bool = False) -> Program:
    """penzai's Llama-like transformer (``llamalike_common``), fp32 parameters, bf16 activations."""
    from penzai import pz
    from penzai.models.transformer.variants import llamalike_common

    width, layers, batch, seq = (256, 2, 8, 64) if small else (2048, 8, 16, 1024)
    cfg = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=width // 128, query_head_multiplier=4 if not small else 1, embedding_dim=width,
        projection_dim=128 if not small else 64,
        mlp_hidden_dim=4 * width, num_decoder_blocks=layers, vocab_size=32000 if not small else 1000, mlp_variant="swiglu",
        tie_embedder_and_logits=False, parameter_dtype=jnp.float32, activation_dtype=jnp.bfloat16)
    unbound, _ = pz.unbind_params(llamalike_common.build_llamalike_transformer(cfg), freeze=True)
    params = jax.eval_shape(lambda: pz.unbind_params(
        llamalike_common.build_llamalike_transformer(cfg, init_base_rng=jax.random.key(0)), freeze=True)[1])

    def logits(params: Any, tokens_BxS: jax.Array) -> jax.Array:
        positions_BxS = jnp.broadcast_to(jnp.arange(tokens_BxS.shape[1]), tokens_BxS.shape)
        out = pz.bind_variables(unbound, params)(pz.nx.wrap(tokens_BxS).tag("batch", "seq"),
                                                 token_positions=pz.nx.wrap(positions_BxS).tag("batch", "seq"))
        return out.untag("batch", "seq", "vocabulary").unwrap()

    return _step(logits, params, batch, seq, "penzai-llama", "penzai")


def transformers_model(kind: str, *, small: bool = False) -> Program:
    """Hugging Face transformers' Flax ``gpt2`` or ``llama`` causal LM from a config (no weights read)."""
    import transformers

    batch, seq = (8, 64) if small else (16, 1024)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=128 if small else 1536, n_layer=2 if small else 12, n_head=4 if small else 16,
                                         vocab_size=1000 if small else 50257, n_positions=seq)
        model = transformers.FlaxGPT2LMHeadModel(config, _do_init=False, dtype=jnp.bfloat16)
    else:
        config = transformers.LlamaConfig(hidden_size=128 if small else 2048, intermediate_size=512 if small else 5632,
                                          num_hidden_layers=2 if small else 8, num_attention_heads=4 if small else 16,
                                          num_key_value_heads=2 if small else 4, vocab_size=1000 if small else 32000,
                                          max_position_embeddings=seq)
        model = transformers.FlaxLlamaForCausalLM(config, _do_init=False, dtype=jnp.bfloat16)
    params = jax.eval_shape(lambda: model.init_weights(jax.random.key(0), (1, seq)))

    def logits(params: Any, tokens_BxS: jax.Array) -> jax.Array:
        positions_BxS = jnp.broadcast_to(jnp.arange(tokens_BxS.shape[1]), tokens_BxS.shape)
        return model.module.apply({"params": params}, tokens_BxS, jnp.ones_like(tokens_BxS), positions_BxS,
                                  deterministic=True).logits

    return _step(logits, params, batch, seq, f"transformers-{kind}", "transformers")


def flax_remat_decoder(*, small: bool = False) -> Program:
    """A decoder of Flax linen layers (``nn.SelfAttention``, ``nn.Dense``), each block under ``nn.remat``."""
    import flax.linen as nn

    width, layers, heads, vocab, batch, seq = (64, 2, 4, 512, 8, 64) if small else (2048, 16, 16, 32000, 16, 2048)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x_BxSxD: jax.Array) -> jax.Array:
            mask = nn.make_causal_mask(jnp.ones(x_BxSxD.shape[:2]))
            x_BxSxD = x_BxSxD + nn.SelfAttention(num_heads=heads, dtype=jnp.bfloat16, deterministic=True)(
                nn.RMSNorm(dtype=jnp.bfloat16)(x_BxSxD), mask=mask)
            hidden = nn.gelu(nn.Dense(4 * width, dtype=jnp.bfloat16)(nn.RMSNorm(dtype=jnp.bfloat16)(x_BxSxD)))
            return x_BxSxD + nn.Dense(width, dtype=jnp.bfloat16)(hidden)

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens_BxS: jax.Array) -> jax.Array:
            x_BxSxD = nn.Embed(vocab, width, dtype=jnp.bfloat16)(tokens_BxS)
            for _ in range(layers):
                x_BxSxD = nn.remat(Block)()(x_BxSxD)
            return nn.Dense(vocab, dtype=jnp.bfloat16)(nn.RMSNorm(dtype=jnp.bfloat16)(x_BxSxD))

    model = Decoder()
    params = jax.eval_shape(model.init, jax.random.key(0), jax.ShapeDtypeStruct((batch, seq), jnp.int32))
    return _step(model.apply, params, batch, seq, "flax-remat-decoder", "flax")


PROGRAMS: dict[str, Callable[..., Program]] = {
    "penzai-llama": penzai_llama,
    "transformers-gpt2": lambda small=False: transformers_model("gpt2", small=small),
    "transformers-llama": lambda small=False: transformers_model("llama", small=small),
    "flax-remat-decoder": flax_remat_decoder,
}
