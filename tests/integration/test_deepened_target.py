"""tune where speculation wins: the toy draft on a deeper toy target (same tokens, costlier)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ADDED_LAYERS, TOY


def test_the_deepened_target_computes_the_same_logits(deep_target: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    models = [
        LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        for d in (TOY / "target", deep_target)
    ]
    assert models[1].config.num_hidden_layers == models[0].config.num_hidden_layers + ADDED_LAYERS
    ids = torch.randint(0, models[0].config.vocab_size, (2, 40), generator=torch.manual_seed(0))
    with torch.no_grad():
        shallow, deep = (m(ids, output_hidden_states=True) for m in models)
    # Every auxiliary layer's states and the logits are bit-identical: the added layers add zero.
    for layer in (1, 2, 3):
        assert torch.equal(shallow.hidden_states[layer], deep.hidden_states[layer])
    assert torch.equal(shallow.logits, deep.logits)
    # ...while each added layer computes real projections that it then multiplies by zero.
    added = models[1].model.layers[-1]
    assert added.self_attn.q_proj.weight.any() and added.mlp.up_proj.weight.any()
    assert not added.self_attn.o_proj.weight.any() and not added.mlp.down_proj.weight.any()
