"""Universal Transformer: the shared tester (ACT and fixed-steps), fixed steps == a weight-tied stack written from the
paper's equations, per-position ACT with halted positions copied, the ponder cost in the loss, generation with left
padding, the encoder heads and the cross-attention of EncoderDecoderModel."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, EncoderDecoderModel

import hf_txvariants  # noqa: F401  (registers the Auto classes)
from hf_txvariants import (
    UniversalTransformerConfig,
    UniversalTransformerForCausalLM,
    UniversalTransformerForMaskedLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
)
from hf_txvariants.modeling_universal import UniversalStepCache
from hf_txvariants.txv_compat import output_cache
from hf_txvariants.txv_positions import sinusoid_table
from tiny_configs import tiny_config
from txv_tester import ATOL, TxvModelTesterMixin

# this file's tiny model: tiny_config("txv_universal") with up to four steps (positions halt after different numbers),
# no dropout and N(0, 0.2) weights
TINY_OVERRIDES = dict(max_steps=4, dropout=0.0, dropatt=0.0, initializer_range=0.2)


def universal_config(**overrides):
    return tiny_config("txv_universal", **{**TINY_OVERRIDES, **overrides})


class TestUniversalTransformerACT(TxvModelTesterMixin):
    model_type = "txv_universal"
    model_classes = (
        UniversalTransformerModel,
        UniversalTransformerForCausalLM,
        UniversalTransformerForMaskedLM,
        UniversalTransformerForSequenceClassification,
    )
    causal_lm_class = UniversalTransformerForCausalLM
    config_overrides = TINY_OVERRIDES


class TestUniversalTransformerFixedSteps(TestUniversalTransformerACT):
    config_overrides = {**TINY_OVERRIDES, "use_act": False, "is_decoder": False}


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return UniversalTransformerForCausalLM(universal_config(**overrides)).eval()


def naive_weight_tied_stack(model, input_ids):
    """h^0 = E x * sqrt(d); for t = 1..T: h^t = Layer_t(h^{t-1} + P + T_t) with T copies of the one layer;
    output LN(h^T) (Dehghani et al. 2019, eq. 1-5 with pre-layer-norm sub-layers)."""
    config = model.config
    layers = nn.ModuleList(copy.deepcopy(model.model.layer) for _ in range(config.num_hidden_layers))
    length = input_ids.shape[1]
    positions = sinusoid_table(torch.arange(length), config.hidden_size)
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
    mask = torch.zeros(length, length).masked_fill(~causal, torch.finfo(torch.float32).min)[None, None]
    h = model.model.embed_tokens(input_ids) * config.hidden_size**0.5
    for t, layer in enumerate(layers, start=1):
        time = sinusoid_table(torch.tensor([float(t)]), config.hidden_size)
        h, _, _ = layer(h + positions + time, mask)
    return model.lm_head(model.model.final_layer_norm(h))


def test_fixed_steps_equals_weight_tied_stack():
    model = build(use_act=False)
    ids = torch.randint(1, 37, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, naive_weight_tied_stack(model, ids), atol=ATOL, rtol=0)
    assert model(ids).n_updates.eq(4).all()


def test_act_outputs_ponder_cost_and_updates_and_adds_it_to_the_loss():
    model = build()
    ids = torch.randint(1, 37, (2, 6), generator=torch.Generator().manual_seed(0))
    output = model(ids, labels=ids)
    assert output.n_updates.shape == (2, 6)
    assert ((output.n_updates >= 1) & (output.n_updates <= 4)).all()
    assert output.ponder_cost.shape == (2, 6)  # rho = N + R per position, 1 <= rho <= max_steps + 1
    assert ((output.ponder_cost >= 1.0) & (output.ponder_cost <= 5.0)).all()
    expected = output.lm_loss + model.config.act_loss_weight * output.ponder_cost.mean()
    torch.testing.assert_close(output.loss, expected)


def test_ponder_cost_in_the_loss_is_the_mean_over_real_positions():
    model = build()
    ids = torch.randint(1, 37, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    output = model(ids, attention_mask=mask, labels=ids)
    assert (output.ponder_cost[1, :2] == 0).all()
    expected = output.lm_loss + model.config.act_loss_weight * output.ponder_cost.sum() / mask.sum()
    torch.testing.assert_close(output.loss, expected)


@pytest.mark.exact
def test_act_positions_halt_per_position_and_halted_states_are_copied():
    model = build(seed=3, halting_bias_init=0.0, initializer_range=0.5)
    ids = torch.randint(1, 37, (4, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        output = model.model(ids, output_hidden_states=True)
    n_updates = output.n_updates
    assert n_updates.unique().numel() > 1, "expected positions to halt at different steps in this example"
    states = output.hidden_states  # state before step 1, after step 1, ...
    for step in range(1, len(states) - 1):
        halted = n_updates <= step  # halted at or before this step: frozen from then on
        # exact: a halted position's state is copied forward, not recomputed
        torch.testing.assert_close(states[step + 1][halted], states[step][halted], atol=0, rtol=0)
        running = n_updates > step + 1
        if running.any():
            assert not torch.allclose(states[step + 1][running], states[step][running])


def test_act_uses_naive_halting_on_the_real_model():
    """The model's n_updates equal those of the ACT rule evaluated by hand on its own halting unit."""
    model = build(seed=5, halting_bias_init=0.0, initializer_range=0.5)
    ids = torch.randint(1, 37, (1, 5), generator=torch.Generator().manual_seed(2))
    inner = model.model
    config = model.config
    with torch.no_grad():
        out = inner(ids)
        positions = torch.arange(5)[None]
        state = inner.embed_tokens(ids) * config.hidden_size**0.5
        mask = torch.zeros(5, 5).masked_fill(
            ~torch.tril(torch.ones(5, 5, dtype=torch.bool)), torch.finfo(torch.float32).min
        )
        cumulative = [0.0] * 5
        halted_at = [None] * 5
        output = torch.zeros_like(state)
        for step in range(config.num_hidden_layers):
            x = state + inner.coordinate_embedding(positions, step, state.dtype)
            y, _, _ = inner.layer(x, mask[None, None])
            h = torch.sigmoid(inner.act.halting(x)).squeeze(-1)[0]
            new_state = state.clone()
            for i in range(5):
                if halted_at[i] is not None:
                    continue
                last = step == config.num_hidden_layers - 1
                if cumulative[i] + float(h[i]) >= config.act_threshold or last:
                    p = 1.0 - cumulative[i]
                    halted_at[i] = step + 1
                else:
                    p = float(h[i])
                    cumulative[i] += p
                output[0, i] += p * y[0, i]
                new_state[0, i] = y[0, i] if halted_at[i] is None else output[0, i]
            state = new_state
            if all(s is not None for s in halted_at):
                break
    assert out.n_updates[0].tolist() == [float(s) for s in halted_at]
    torch.testing.assert_close(out.last_hidden_state, inner.final_layer_norm(output), atol=ATOL, rtol=0)


@pytest.mark.exact
def test_left_padded_generation_equals_rows_alone():
    model = build()
    rows = [torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9, 10]])]
    alone = [
        model.generate(r, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)[0, -3:] for r in rows
    ]
    batch = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    together = model.generate(
        batch, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    assert torch.equal(together[0, -3:], alone[0]) and torch.equal(together[1, -3:], alone[1])


def test_masked_lm_is_bidirectional_and_causal_lm_is_not():
    config = universal_config()
    torch.manual_seed(0)
    mlm = UniversalTransformerForMaskedLM(config).eval()
    clm = UniversalTransformerForCausalLM(config).eval()
    clm.load_state_dict(mlm.state_dict())
    ids = torch.randint(1, 37, (1, 6), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 37
    with torch.no_grad():
        assert not torch.allclose(mlm(ids).logits[0, 0], mlm(changed).logits[0, 0])
        torch.testing.assert_close(clm(ids).logits[0, :-1], clm(changed).logits[0, :-1], atol=ATOL, rtol=0)
    labels = torch.full_like(ids, -100)
    labels[0, 2] = 4
    assert mlm(ids, labels=labels).loss.isfinite()
    classifier = UniversalTransformerForSequenceClassification(universal_config(num_labels=3))
    assert classifier(ids, labels=torch.tensor([1])).logits.shape == (1, 3)


def test_encoder_decoder_cross_attention():
    encoder_config = universal_config(is_decoder=False)
    decoder_config = universal_config(is_decoder=True, add_cross_attention=True)
    torch.manual_seed(0)
    encoder = UniversalTransformerModel(encoder_config)
    decoder = UniversalTransformerForCausalLM(decoder_config)
    model = EncoderDecoderModel(encoder=encoder, decoder=decoder).eval()
    source = torch.randint(1, 37, (2, 5), generator=torch.Generator().manual_seed(0))
    source_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    target = torch.randint(1, 37, (2, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        output = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target, output_attentions=True)
        # the decoder reads the encoder: other source tokens give other logits
        other = model(input_ids=(source + 1) % 37, attention_mask=source_mask, decoder_input_ids=target)
        assert not torch.allclose(output.logits, other.logits)
        # padded source positions are not attended to
        changed = source.clone()
        changed[1, 3:] = 1
        padded = model(input_ids=changed, attention_mask=source_mask, decoder_input_ids=target)
        torch.testing.assert_close(padded.logits[1], output.logits[1], atol=ATOL, rtol=0)
    assert output.cross_attentions is not None and output.cross_attentions[0].shape[-1] == 5
    generated = model.generate(
        source,
        attention_mask=source_mask,
        max_new_tokens=3,
        do_sample=False,
        use_cache=False,
        eos_token_id=None,
        pad_token_id=0,
        decoder_start_token_id=1,
    )
    assert generated.shape == (2, 4)


def test_auto_class_and_paper_names():
    config = UniversalTransformerConfig(d_model=8, n_head=2, d_inner=16, max_steps=3, vocab_size=11, act_epsilon=0.05)
    assert (config.hidden_size, config.num_hidden_layers) == (8, 3)
    assert config.act_threshold == pytest.approx(0.95)
    assert isinstance(AutoModelForCausalLM.from_config(config), UniversalTransformerForCausalLM)


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("hidden_size", {"d_model": 15, "n_head": 3, "d_head": 5}),
        ("act_threshold", {"act_threshold": 1.5}),
        ("num_hidden_layers", {"max_steps": 0}),
        ("num_attention_heads", {"d_model": 16, "n_head": 3}),
        ("dropout", {"dropout": 1.0}),
    ],
)
def test_bad_config_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_universal", **kwargs)


def test_bad_input_names_the_tensor():
    model = build()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="add_cross_attention"):
        model(torch.tensor([[1, 2]]), encoder_hidden_states=torch.zeros(1, 2, 16))


@pytest.mark.exact
@pytest.mark.parametrize("use_act", [True, False])
def test_step_cache_incremental_equals_full_pass(use_act):
    """Chunks with the UniversalStepCache give the logits and steps of one pass; in this example later chunks run
    more steps than earlier ones, so frozen step inputs of halted positions are recomputed from the cache."""
    model = build(seed=0, use_act=use_act, halting_bias_init=0.0, initializer_range=0.5)
    tokens = torch.randint(1, 37, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0  # a left-padded row
    with torch.no_grad():
        full = model(tokens, attention_mask=mask)
        cache, logits, steps = None, [], []
        for start, end in [(0, 4), (4, 5), (5, 10)]:
            out = model(tokens[:, start:end], attention_mask=mask[:, :end], cache=cache, use_cache=True)
            cache = output_cache(out)
            logits.append(out.logits)
            steps.append(out.n_updates)
    real = mask.bool()
    torch.testing.assert_close(torch.cat(logits, 1)[real], full.logits[real], atol=ATOL, rtol=0)
    assert torch.equal(torch.cat(steps, 1)[real], full.n_updates[real])
    if use_act:
        assert full.n_updates.unique().numel() > 1


@pytest.mark.exact
def test_generate_with_cache_equals_without():
    model = build(seed=0, halting_bias_init=0.0, initializer_range=0.5)
    prompt = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(model.generate(prompt, **kwargs), model.generate(prompt, use_cache=False, **kwargs))
    beams = dict(kwargs, num_beams=2)
    assert torch.equal(model.generate(prompt, **beams), model.generate(prompt, use_cache=False, **beams))


def test_foreign_cache_is_a_clear_error():
    from transformers import DynamicCache

    model = build()
    with pytest.raises(ValueError, match="use_cache=False"):
        model(torch.tensor([[1, 2]]), cache=DynamicCache())


# ------------------------------------------------------------------------------------------------------------------
# the paper's post-LN layer and separable-convolution transition, against the equations written out here


def naive_layer_norm(x, layer_norm):
    mean = x.mean(-1, keepdim=True)
    variance = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + layer_norm.eps) * layer_norm.weight + layer_norm.bias


def naive_attention(attention, x, allowed):
    """MultiHead(x) = Concat_h(softmax(Q_h K_h^T / sqrt(d_head)) V_h) W_O, Q_h = x W_Q^h (Vaswani et al. eq. 1)."""
    batch, length, _ = x.shape
    heads, head_dim = attention.num_heads, attention.head_dim

    def project(linear):
        return (x @ linear.weight.T + linear.bias).view(batch, length, heads, head_dim).transpose(1, 2)

    query, key, value = project(attention.q_proj), project(attention.k_proj), project(attention.v_proj)
    scores = (query @ key.transpose(-1, -2) / head_dim**0.5).masked_fill(~allowed, float("-inf"))
    mixed = (scores.softmax(-1) @ value).transpose(1, 2).reshape(batch, length, heads * head_dim)
    return mixed @ attention.o_proj.weight.T + attention.o_proj.bias


def naive_feed_forward(x, transition):
    first, second = transition.CoreNet[0], transition.CoreNet[3]
    return torch.relu(x @ first.weight.T + first.bias) @ second.weight.T + second.bias


def naive_separable_conv(x, conv, causal):
    """Depthwise: z_{i,c} = sum_m w_{c,m} x_{i - offset + m, c} (zeros outside the sequence); pointwise: z W_p + b."""
    kernel = conv.depthwise.weight[:, 0, :]  # [channels, kernel_size]
    offset = kernel.shape[1] - 1 if causal else (kernel.shape[1] - 1) // 2
    z = torch.zeros_like(x)
    for i in range(x.shape[1]):
        for m in range(kernel.shape[1]):
            j = i - offset + m
            if 0 <= j < x.shape[1]:
                z[:, i] += kernel[:, m] * x[:, j]
    return z @ conv.pointwise.weight.T + conv.pointwise.bias


def naive_separable_conv_transition(x, transition, real, causal):
    """SepConv_2(ReLU(SepConv_1(x))), padding positions zeroed before each convolution."""
    keep = real[..., None].float()
    inner = torch.relu(naive_separable_conv(x * keep, transition.first, causal))
    return naive_separable_conv(inner * keep, transition.second, causal)


def naive_universal_transformer(model, input_ids, real, causal):
    """Dehghani et al. 2019, eq. 4-5 with T fixed steps: x^t = H^{t-1} + P + T_t;
    post: A^t = LN(x^t + MHA(x^t)), H^t = LN(A^t + Transition(A^t)), output H^T;
    pre:  A^t = x^t + MHA(LN(x^t)), H^t = A^t + Transition(LN(A^t)), output LN(H^T)."""
    config, inner = model.config, model.model
    layer = inner.layer
    length = input_ids.shape[1]
    allowed = real[:, None, None, :]
    if causal:
        allowed = allowed & torch.tril(torch.ones(length, length, dtype=torch.bool))
    if config.transition == "separable_conv":
        transition = lambda a: naive_separable_conv_transition(a, layer.transition, real, causal)  # noqa: E731
    else:
        transition = lambda a: naive_feed_forward(a, layer.transition)  # noqa: E731
    position_ids = (real.long().cumsum(-1) - 1).clamp(min=0)
    positions = sinusoid_table(position_ids.reshape(-1), config.hidden_size).view(*position_ids.shape, -1)
    h = inner.embed_tokens.weight[input_ids] * config.hidden_size**0.5
    for t in range(1, config.num_hidden_layers + 1):
        x = h + positions + sinusoid_table(torch.tensor([float(t)]), config.hidden_size)
        if config.layer_norm_position == "post":
            a = naive_layer_norm(x + naive_attention(layer.self_attn, x, allowed), layer.self_attn_layer_norm)
            h = naive_layer_norm(a + transition(a), layer.transition_layer_norm)
        else:
            a = x + naive_attention(layer.self_attn, naive_layer_norm(x, layer.self_attn_layer_norm), allowed)
            h = a + transition(naive_layer_norm(a, layer.transition_layer_norm))
    if config.layer_norm_position == "pre":
        h = naive_layer_norm(h, inner.final_layer_norm)
    return h @ model.lm_head.weight.T


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
@pytest.mark.parametrize("transition", ["feed_forward", "separable_conv"])
@pytest.mark.parametrize("head", [UniversalTransformerForCausalLM, UniversalTransformerForMaskedLM])
def test_layer_equals_the_paper_equations(layer_norm_position, transition, head):
    config = universal_config(
        use_act=False,
        initializer_range=0.3,
        layer_norm_position=layer_norm_position,
        transition=transition,
        separable_conv_kernel_sizes=[3, 2],
    )
    torch.manual_seed(0)
    model = head(config).eval()
    ids = torch.randint(1, 37, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # right padding
    causal = head is UniversalTransformerForCausalLM
    with torch.no_grad():
        expected = naive_universal_transformer(model, ids, mask.bool(), causal)
        logits = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(logits[mask.bool()], expected[mask.bool()], atol=1e-4, rtol=0)
    if layer_norm_position == "post":
        assert isinstance(model.model.final_layer_norm, nn.Identity)


class TestUniversalTransformerPaperLayer(TestUniversalTransformerACT):
    """The shared tester on the paper's options: post-LN with the (causal) separable-convolution transition."""

    config_overrides = {**TINY_OVERRIDES, "layer_norm_position": "post", "transition": "separable_conv"}


@pytest.mark.exact
def test_separable_conv_generation_recomputes_the_sequence_and_keeps_left_padding_exact():
    model = build(transition="separable_conv", layer_norm_position="post")
    rows = [torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9, 10]])]
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    alone = [model.generate(r, **kwargs)[0, -3:] for r in rows]
    batch = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    together = model.generate(batch, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]), **kwargs)
    assert torch.equal(together[0, -3:], alone[0]) and torch.equal(together[1, -3:], alone[1])
    ids = rows[0]
    with torch.no_grad():  # greedy by hand: a full pass per token
        for _ in range(3):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(ids[0, -3:], alone[0])
    with pytest.raises(ValueError, match="separable_conv"):
        model(rows[0], use_cache=True)


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("layer_norm_position", {"layer_norm_position": "middle"}),
        ("transition", {"transition": "conv"}),
        ("separable_conv_kernel_sizes", {"separable_conv_kernel_sizes": [3]}),
        ("separable_conv_kernel_sizes", {"separable_conv_kernel_sizes": [3, 0]}),
    ],
)
def test_bad_paper_option_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_universal", **kwargs)


# ------------------------------------------------------------------------------------------------------------------
# behaving like a transformers decoder (issue 13)


def test_generate_uses_the_step_cache_by_default():
    model = build(seed=0, halting_bias_init=0.0, initializer_range=0.5)
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = model.generate(
        prompt, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None, return_dict_in_generate=True
    )
    assert isinstance(output_cache(out), UniversalStepCache)
    assert output_cache(out).past_length == 6  # the prompt and every token fed back (not the last one)


@pytest.mark.exact
def test_generate_from_inputs_embeds_equals_generate_from_input_ids():
    model = build(seed=0, halting_bias_init=0.0, initializer_range=0.5)
    prompt = torch.tensor([[5, 6, 7, 8], [3, 9, 10, 11]])
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    from_ids = model.generate(prompt, **kwargs)
    embeddings = model.get_input_embeddings()(prompt).detach()
    from_embeddings = model.generate(inputs_embeds=embeddings, **kwargs)  # decoder-only: the new tokens only
    assert torch.equal(from_embeddings, from_ids[:, 4:])
    other = model.generate(inputs_embeds=model.get_input_embeddings()(prompt.flip(0)).detach(), **kwargs)
    assert torch.equal(other, from_ids.flip(0)[:, 4:])  # the embeddings are read, not ignored


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_returns_attentions_and_hidden_states_of_every_step(use_cache):
    model = build(seed=0, halting_bias_init=0.0, initializer_range=0.5)
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = model.generate(
        prompt,
        max_new_tokens=3,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        use_cache=use_cache,
        output_attentions=True,
        output_hidden_states=True,
        return_dict_in_generate=True,
    )
    assert len(out.attentions) == 3 and len(out.hidden_states) == 3
    for token, (attentions, states) in enumerate(zip(out.attentions, out.hidden_states)):
        assert attentions is not None and all(a is not None for a in attentions)
        assert states is not None and all(s is not None for s in states)
        query_length = 1 if use_cache and token else 4 + token
        assert attentions[0].shape[-2:] == (query_length, 4 + token)


def test_batched_pipelines_equal_one_row_at_a_time():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, pipeline

    words = ["[PAD]", "[MASK]"] + [f"w{i}" for i in range(35)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", mask_token="[MASK]", unk_token="w0"
    )
    config = universal_config(is_decoder=False, halting_bias_init=0.0, num_labels=2)
    torch.manual_seed(0)
    tasks = [
        ("text-classification", UniversalTransformerForSequenceClassification(config), ["w1 w2 w3", "w4 w5", "w6"]),
        ("fill-mask", UniversalTransformerForMaskedLM(config), ["w1 [MASK] w3", "w4 [MASK]", "[MASK] w9 w2"]),
    ]
    for task, model, texts in tasks:
        batched = pipeline(task, model=model.eval(), tokenizer=tokenizer, batch_size=2)(texts)
        single = pipeline(task, model=model, tokenizer=tokenizer, batch_size=1)(texts)
        assert len(batched) == len(texts)
        for a, b in zip(batched, single):
            a, b = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
            assert [x.get("label", x.get("token")) for x in a] == [x.get("label", x.get("token")) for x in b]
            assert [x["score"] for x in a] == pytest.approx([x["score"] for x in b], abs=1e-5)


def test_crop_removes_the_last_positions_exactly():
    model = build(seed=0, halting_bias_init=0.0, initializer_range=0.5)
    tokens = torch.randint(1, 37, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(torch.cat([tokens[:, :4], tokens[:, 7:]], dim=1)).logits
        first = model(tokens[:, :4], use_cache=True)
        cache = output_cache(model(tokens[:, 4:7], cache=output_cache(first), use_cache=True))
        cache.crop(-3)  # forget the 3 rejected tokens
        assert cache.past_length == 4
        last = model(tokens[:, 7:], cache=cache, use_cache=True).logits
    torch.testing.assert_close(torch.cat([first.logits, last], dim=1), full, atol=ATOL, rtol=0)


@pytest.mark.exact
def test_assisted_decoding_gives_the_greedy_tokens():
    model = build(seed=0, halting_bias_init=0.0, initializer_range=0.5)
    assistant = build(seed=1, halting_bias_init=0.0, initializer_range=0.5)  # proposes other tokens: crops happen
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6]])
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    greedy = model.generate(prompt, **kwargs)
    assert torch.equal(model.generate(prompt, assistant_model=assistant, **kwargs), greedy)
    assert torch.equal(model.generate(prompt, prompt_lookup_num_tokens=2, **kwargs), greedy)


def test_shift_labels_are_the_targets_when_given():
    model = build()
    ids = torch.randint(1, 37, (2, 6), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(1, 37, (2, 6), generator=torch.Generator().manual_seed(1))
    output = model(ids, labels=ids, shift_labels=targets)
    expected = nn.functional.cross_entropy(output.logits.reshape(-1, 37), targets.reshape(-1))
    torch.testing.assert_close(output.lm_loss, expected)


@pytest.mark.parametrize("use_act", [True, False])
@pytest.mark.slow  # torch.export and torch.compile
def test_torch_export_and_compile_fullgraph_trace_the_model(use_act):
    model = build(seed=0, use_act=use_act, halting_bias_init=0.0, initializer_range=0.5)
    ids = torch.randint(1, 37, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids).logits
        exported = torch.export.export(model, (ids,)).module()(ids)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")(ids)
    torch.testing.assert_close(exported.logits, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(compiled.logits, expected, atol=ATOL, rtol=0)
    # ACT runs every step when traced (no data-dependent stop); the halted positions are unchanged by them
    torch.testing.assert_close(compiled.n_updates, model(ids).n_updates)


def test_halting_bias_init_is_the_initial_halting_bias():
    """The generic Linear initialisation used to claim the halting unit's bias first, leaving it at 0."""
    for bias in (-1.0, 2.0):
        model = build(halting_bias_init=bias)
        torch.testing.assert_close(model.model.act.halting.bias, torch.tensor([bias]))
