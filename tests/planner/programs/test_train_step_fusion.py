"""`costmodel.oplevel.fusion` on traced training steps: the fusions it forms can run one after another."""

import networkx as nx
import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.oplevel.fusion import _fusions, recomputed
from costmodel.oplevel.opgraph import OP_ATTR
from planner.intraop.extract import extract_graph
from planner.programs.train_step import abstract_train_inputs, make_train_step

TINY = ModelConfig(name="t", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=96)
TINY_MOE = ModelConfig(**{**TINY.model_dump(), "num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 64})
TINY_GPT = ModelConfig(**{**TINY.model_dump(), "norm": "layernorm", "mlp": "gelu", "positions": "learned", "num_kv_heads": 4,
                          "qkv_bias": True, "mlp_bias": True})


@pytest.mark.parametrize("cfg", [TINY, TINY_MOE, TINY_GPT], ids=["llama", "moe", "gpt"])
@pytest.mark.parametrize("remat", ["none", "selective", "full"])
def test_the_fusions_of_a_training_step_form_an_acyclic_graph(cfg, remat):
    train = TrainConfig(seq_len=16, global_batch=4)
    g = extract_graph(make_train_step(cfg, train, remat=remat, micro_batches=2), *abstract_train_inputs(cfg, train))
    ops = {n: d[OP_ATTR] for n, d in g.nodes(data=True)}
    again = recomputed(g)
    fusion = _fusions(g, ops, again)

    def kernel(n):
        return fusion.get(n, ("op", n))

    def readers(n):
        """The kernels a recomputed op is computed in."""
        return {r for v in g.successors(n) for r in (readers(v) if v in again else {kernel(v)})}

    quotient = nx.DiGraph()
    for u, v in g.edges:
        if u not in again:
            quotient.add_edges_from((kernel(u), r) for r in (readers(v) if v in again else {kernel(v)}) if r != kernel(u))
    assert nx.is_directed_acyclic_graph(quotient)
    assert len(set(fusion.values())) < len(fusion) / 3  # most elementwise ops share a kernel
