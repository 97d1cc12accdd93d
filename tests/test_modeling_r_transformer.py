"""R-Transformer (txv_r_transformer): parity with the authors' code (fixtures from
tests/fixtures/make_r_transformer_fixtures.py), the shared tester, a naive re-implementation written out position by
position, causality, padding, and config errors. The LocalRNN itself: tests/test_local_rnn.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import hf_txvariants  # noqa: F401
from hf_txvariants.configuration_r_transformer import RTransformerConfig
from hf_txvariants.modeling_r_transformer import (
    RTransformerForCausalLM,
    RTransformerForSequenceClassification,
    RTransformerModel,
)
from hf_txvariants.txv_compat import output_cache
from tiny_configs import tiny_config
from txv_tester import TxvModelTesterMixin

# this file's tiny model: tiny_config("txv_r_transformer") with two RNN layers and dropout on (the tester checks that
# evaluation turns it off and that gradient checkpointing replays it)
TINY_OVERRIDES = dict(num_rnn_layers=2, dropout=0.1, attention_dropout=0.1, embedding_dropout=0.1)


class TestRTransformer(TxvModelTesterMixin):
    model_type = "txv_r_transformer"
    config_overrides = TINY_OVERRIDES
    model_classes = (RTransformerModel, RTransformerForCausalLM, RTransformerForSequenceClassification)
    causal_lm_class = RTransformerForCausalLM


@pytest.mark.slow
class TestRTransformerLSTMStandardNorm(TxvModelTesterMixin):
    model_type = "txv_r_transformer"
    model_classes = (RTransformerModel,)
    config_overrides = {
        **TINY_OVERRIDES,
        "rnn_type": "LSTM",
        "num_rnn_layers": 1,
        "layer_norm_type": "standard",
        "final_layer_norm": True,
    }


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return RTransformerForCausalLM(tiny_config("txv_r_transformer", **{**TINY_OVERRIDES, **overrides})).eval()


def ids(batch=2, length=8, seed=0):
    return torch.randint(1, 19, (batch, length), generator=torch.Generator().manual_seed(seed))


def naive_forward(model: RTransformerModel, x: torch.Tensor) -> torch.Tensor:
    """The R-Transformer written out position by position: for each block, LocalRNN sub-layers
    h_t = x_t + RNN(LN(x)_{t-k+1..t}) (zeros before the start), causal softmax(q k^T / sqrt(d)) v attention per head,
    FFN; all as x + f(LN(x)); final LN."""
    k = model.config.local_window
    hidden = model.embed_tokens(x)
    batch, length, width = hidden.shape
    for block in model.layers:
        for rnn_layer in block.rnn_layers:
            normed = rnn_layer.layer_norm(hidden)
            summaries = []
            for t in range(length):
                window = torch.zeros(batch, k, width)
                start = max(0, t - k + 1)
                window[:, k - (t + 1 - start) :] = normed[:, start : t + 1]
                summaries.append(rnn_layer.local_rnn.rnn(window)[0][:, -1])
            hidden = hidden + torch.stack(summaries, 1)
        attn = block.self_attn
        normed = block.attention_layer_norm(hidden)
        heads = []
        for h in range(attn.num_heads):
            part = slice(h * attn.head_dim, (h + 1) * attn.head_dim)
            q = normed @ attn.q_proj.weight[part].t() + attn.q_proj.bias[part]
            key = normed @ attn.k_proj.weight[part].t() + attn.k_proj.bias[part]
            v = normed @ attn.v_proj.weight[part].t() + attn.v_proj.bias[part]
            scores = q @ key.transpose(1, 2) / attn.head_dim**0.5
            scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
            heads.append(scores.softmax(-1) @ v)
        hidden = hidden + attn.o_proj(torch.cat(heads, -1))
        ff = block.mlp.CoreNet
        hidden = hidden + ff[3](torch.relu(ff[0](block.feed_forward_layer_norm(hidden))))
    return hidden if model.norm is None else model.norm(hidden)


@pytest.mark.parametrize("rnn_type", ["GRU", "LSTM", "RNN"])
def test_matches_naive_forward(rnn_type):
    model = build(rnn_type=rnn_type).model
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).last_hidden_state, naive_forward(model, x), atol=1e-5, rtol=0)


def test_causal_and_position_free():
    """A later token never changes an earlier output; there is no position embedding parameter."""
    model = build()
    x = ids()
    changed = x.clone()
    changed[:, 5:] = 3
    with torch.no_grad():
        torch.testing.assert_close(model(changed).logits[:, :5], model(x).logits[:, :5], atol=1e-6, rtol=0)
    assert not any("position" in name for name, _ in model.named_parameters())


@pytest.mark.exact
def test_left_padding_equals_row_alone():
    model = build()
    x = ids(1, 6)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), x], dim=1)
    mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 6)], dim=1).long()
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, 4:], model(x).logits, atol=1e-5, rtol=0)
    batch = torch.cat([padded, ids(1, 10, seed=3)])
    batch_mask = torch.cat([mask, torch.ones(1, 10, dtype=torch.long)])
    together = model.generate(batch, attention_mask=batch_mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    alone = model.generate(x, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(together[0, 4:], alone[0])


def test_cache_incremental_equals_full():
    """RTransformerCache: attention keys/values + the last k - 1 LocalRNN inputs per sub-layer (k = 3 > chunk of 1)."""
    model = build()
    x = ids(length=10)
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        first = model(x[:, :4], use_cache=True)
        second = model(x[:, 4:5], cache=output_cache(first))
        third = model(x[:, 5:], cache=output_cache(second))
    assert set(output_cache(third).rnn_prefixes) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    torch.testing.assert_close(torch.cat([first.logits, second.logits, third.logits], 1), full, atol=1e-5, rtol=0)


@pytest.mark.exact
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_with_cache_equals_without(num_beams):
    model = build()
    prompt = ids(2, 4)
    kwargs = dict(max_new_tokens=5, do_sample=False, num_beams=num_beams, pad_token_id=0)
    assert torch.equal(
        model.generate(prompt, use_cache=True, **kwargs), model.generate(prompt, use_cache=False, **kwargs)
    )


def test_generate_returns_every_step_attentions_and_hidden_states():
    """The output flags reach the model at every step (prepare_inputs_for_generation used to drop them)."""
    model = build()
    out = model.generate(
        ids(2, 4),
        max_new_tokens=3,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_attentions=True,
        output_hidden_states=True,
    )
    assert len(out.attentions) == len(out.hidden_states) == 3
    for step, (attentions, hidden_states) in enumerate(zip(out.attentions, out.hidden_states)):
        query_length, key_length = (4, 4) if step == 0 else (1, 4 + step)
        assert len(attentions) == 2 and all(a.shape == (2, 2, query_length, key_length) for a in attentions)
        assert len(hidden_states) == 3 and all(h.shape == (2, query_length, 16) for h in hidden_states)


@pytest.mark.exact
def test_generate_from_inputs_embeds_equals_input_ids():
    model = build()
    prompt = ids(2, 5)
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    from_ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
    embeds = model.get_input_embeddings()(prompt)
    from_embeds = model.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(prompt), **kwargs)
    assert torch.equal(from_embeds, from_ids[:, prompt.shape[1] :])  # generate returns only the new tokens


def test_assisted_decoding_is_refused_with_transformers_error():
    """The LocalRNN state cannot be cropped back: the model is declared stateful, so transformers names the cause."""
    model, assistant = build(), build(seed=1)
    with pytest.raises(ValueError, match="stateful"):
        model.generate(ids(1, 4), max_new_tokens=3, do_sample=False, pad_token_id=0, assistant_model=assistant)


def test_errors_name_the_field():
    with pytest.raises(ValueError, match="rnn_type"):
        tiny_config("txv_r_transformer", rnn_type="QRNN")
    with pytest.raises(ValueError, match="local_window"):
        tiny_config("txv_r_transformer", local_window=0)
    with pytest.raises(ValueError, match="attention_mask"):
        build()(ids(), attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="RTransformerCache"):
        from transformers import DynamicCache

        build()(ids(), cache=DynamicCache())
    config = RTransformerConfig(d_model=32, h=4, ksize=5, n_level=2, n=1)
    assert (config.hidden_size, config.num_attention_heads, config.local_window, config.intermediate_size) == (
        32,
        4,
        5,
        128,
    )


FIXTURES = Path(__file__).parent / "fixtures" / "r_transformer_original"
# The original's parameter names -> ours (the original's unused `local_rnn.output`, `rt.norm`, `rt.feed_forward`
# are dropped: they are built but never called).
KEY_MAP = [
    (r"^encoder\.weight$", "model.embed_tokens.weight"),
    (r"^decoder\.(weight|bias)$", r"lm_head.\1"),
    (
        r"^rt\.forward_net\.(\d+)\.layers\.(\d+)\.local_rnn\.rnn\.(.*)$",
        r"model.layers.\1.rnn_layers.\2.local_rnn.rnn.\3",
    ),
    (
        r"^rt\.forward_net\.(\d+)\.layers\.(\d+)\.connection\.norm\.a_2$",
        r"model.layers.\1.rnn_layers.\2.layer_norm.weight",
    ),
    (
        r"^rt\.forward_net\.(\d+)\.layers\.(\d+)\.connection\.norm\.b_2$",
        r"model.layers.\1.rnn_layers.\2.layer_norm.bias",
    ),
    (r"^rt\.forward_net\.(\d+)\.connections\.0\.norm\.a_2$", r"model.layers.\1.attention_layer_norm.weight"),
    (r"^rt\.forward_net\.(\d+)\.connections\.0\.norm\.b_2$", r"model.layers.\1.attention_layer_norm.bias"),
    (r"^rt\.forward_net\.(\d+)\.connections\.1\.norm\.a_2$", r"model.layers.\1.feed_forward_layer_norm.weight"),
    (r"^rt\.forward_net\.(\d+)\.connections\.1\.norm\.b_2$", r"model.layers.\1.feed_forward_layer_norm.bias"),
    (r"^rt\.forward_net\.(\d+)\.pooling\.linears\.0\.(.*)$", r"model.layers.\1.self_attn.q_proj.\2"),
    (r"^rt\.forward_net\.(\d+)\.pooling\.linears\.1\.(.*)$", r"model.layers.\1.self_attn.k_proj.\2"),
    (r"^rt\.forward_net\.(\d+)\.pooling\.linears\.2\.(.*)$", r"model.layers.\1.self_attn.v_proj.\2"),
    (r"^rt\.forward_net\.(\d+)\.pooling\.linears\.3\.(.*)$", r"model.layers.\1.self_attn.o_proj.\2"),
    (r"^rt\.forward_net\.(\d+)\.feed_forward\.w_1\.(.*)$", r"model.layers.\1.mlp.CoreNet.0.\2"),
    (r"^rt\.forward_net\.(\d+)\.feed_forward\.w_2\.(.*)$", r"model.layers.\1.mlp.CoreNet.3.\2"),
]
UNUSED = (r"\.local_rnn\.output\.", r"^rt\.norm\.", r"^rt\.feed_forward\.")


def convert(original_state):
    converted = {}
    for key, tensor in original_state.items():
        if any(re.search(pattern, key) for pattern in UNUSED):
            continue
        for pattern, target in KEY_MAP:
            if re.match(pattern, key):
                converted[re.sub(pattern, target, key)] = tensor
                break
        else:
            raise AssertionError(f"unmapped original key {key}")
    return converted


@pytest.mark.parametrize("case", sorted(p.stem for p in FIXTURES.glob("*.safetensors")))
def test_matches_original_code(case):
    with safe_open(str(FIXTURES / f"{case}.safetensors"), "pt") as f:
        meta = f.metadata()
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    config = RTransformerConfig(
        vocab_size=int(meta["vocab"]),
        d_model=int(meta["d_model"]),
        h=int(meta["h"]),
        n=int(meta["n"]),
        ksize=int(meta["ksize"]),
        n_level=int(meta["n_level"]),
        rnn_type=meta["rnn_type"],
    )
    model = RTransformerForCausalLM(config).eval()
    state = convert({k[len("state.") :]: v for k, v in tensors.items() if k.startswith("state.")})
    ours = model.state_dict()
    assert set(state) == set(ours), set(state) ^ set(ours)
    for key, tensor in state.items():
        assert tensor.shape == ours[key].shape, key
    model.load_state_dict(state)
    with torch.no_grad():
        logits = model(tensors["input_ids"]).logits
    torch.testing.assert_close(logits, tensors["logits"], atol=1e-5, rtol=0)


def test_fixtures_present():
    assert len(list(FIXTURES.glob("*.safetensors"))) == 3
