"""Run by test_exports in a subprocess with 8 emulated devices: a Flax transformer block
written with logical axis names, sharded by `flax_logical_rules` of a plan, compiles."""

# Run as a script only: pytest's --doctest-modules imports every module under tests/.
if __name__ == "__main__":
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

    import flax.linen as nn  # noqa: E402
    import jax  # noqa: E402
    import jax.numpy as jnp  # noqa: E402

    from costmodel.inputs.layout import Layout  # noqa: E402
    from costmodel.inputs.model_config import ModelConfig  # noqa: E402
    from planner.api import layout_plan  # noqa: E402
    from planner.cli.exports import flax_logical_rules  # noqa: E402

    D, N, H, F, V = 64, 8, 8, 256, 512  # width, heads, head size, MLP width, vocabulary


    def param(module, name, shape, names):
        return module.param(name, nn.with_logical_partitioning(nn.initializers.normal(0.02), names), shape)


    class Block(nn.Module):
        @nn.compact
        def __call__(self, tokens_BxS):
            x_BxSxD = param(self, "tokens", (V, D), ("vocab", "embed"))[tokens_BxS]
            q, k, v = (jnp.einsum("bsd,dnh->bsnh", x_BxSxD, param(self, w, (D, N, H), ("embed", "heads", "head_dim")))
                       for w in ("wq", "wk", "wv"))
            att_BxNxSxS = jax.nn.softmax(jnp.einsum("bsnh,btnh->bnst", q, k) / H**0.5)
            x_BxSxD = x_BxSxD + jnp.einsum(
                "bnst,btnh,nhd->bsd", att_BxNxSxS, v, param(self, "wo", (N, H, D), ("heads", "head_dim", "embed")))
            hidden_BxSxF = jax.nn.gelu(x_BxSxD @ param(self, "w_in", (D, F), ("embed", "mlp")))
            x_BxSxD = x_BxSxD + hidden_BxSxF @ param(self, "w_out", (F, D), ("mlp", "embed"))
            return x_BxSxD @ param(self, "lm_head", (D, V), ("embed", "vocab"))


    cfg = ModelConfig(name="tiny", hidden_size=D, num_layers=2, num_heads=N, num_kv_heads=N, ffn_size=F, vocab_size=V)
    plan = layout_plan(cfg, Layout(dp=2, tp=4, zero_stage=3), mesh="data=2,tensor=4", global_batch=8, seq_len=32)
    rules = flax_logical_rules(plan)
    mesh = jax.make_mesh((2, 4), ("data", "tensor"))
    model, tokens = Block(), jnp.zeros((8, 32), jnp.int32)
    abstract = jax.eval_shape(model.init, jax.random.key(0), tokens)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)


    def loss(params, tokens_BxS):
        logits_BxSxV = model.apply(params, tokens_BxS)
        return -jnp.mean(jax.nn.log_softmax(logits_BxSxV)[..., 0])


    step = jax.jit(jax.grad(loss), in_shardings=(shardings, jax.NamedSharding(mesh, jax.P("data"))), out_shardings=shardings)
    compiled = step.lower(abstract, jax.ShapeDtypeStruct(tokens.shape, tokens.dtype)).compile()
    specs = {"/".join(k.key for k in path): s.spec for path, s in jax.tree_util.tree_flatten_with_path(shardings)[0]}
    print(specs["params/wq"], specs["params/w_in"], specs["params/tokens"])
