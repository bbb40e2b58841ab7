"""Run by test_shardings in a subprocess with 8 emulated devices: `partition_spec_tree` of a
plan goes straight into ``jax.jit(..., in_shardings=...)`` for the reference model's gradient."""

# Run as a script only: pytest's --doctest-modules imports every module under tests/.
if __name__ == "__main__":
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

    import jax  # noqa: E402
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

    from costmodel.inputs.layout import Layout  # noqa: E402
    from costmodel.inputs.model_config import ModelConfig  # noqa: E402
    from planner.api import layout_plan  # noqa: E402
    from planner.programs.train_step import abstract_train_inputs, loss_fn  # noqa: E402
    from planner.shardings import partition_spec_tree  # noqa: E402

    cfg = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=4, ffn_size=256, vocab_size=512)
    plan = layout_plan(cfg, Layout(dp=2, tp=4, zero_stage=3), mesh="data=2,tensor=4", global_batch=8, seq_len=32)
    mesh = jax.make_mesh((2, 4), ("data", "tensor"))
    specs = partition_spec_tree(cfg, plan.param_specs)
    params, _, batch = abstract_train_inputs(cfg, plan.train)
    with jax.set_mesh(mesh):
        grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, b, cfg)), in_shardings=(specs, PartitionSpec("data")), out_shardings=specs)
        compiled = grad.lower(params, batch).compile()
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    assert jax.tree.structure(shardings) == jax.tree.structure(params)
    print(specs["layers"]["attn"]["wq"], specs["layers"]["mlp"]["w_in"], len(compiled.as_text()) > 0)
