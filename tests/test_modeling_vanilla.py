"""Vanilla Transformer (txv_vanilla): the shared tester (decoder and encoder), parity with torch's own
nn.TransformerEncoderLayer (an independent implementation of Vaswani et al.), cache, padding, Al-Rfou's auxiliary
losses recomputed by hand, the sliding-window evaluation, and EncoderDecoderModel."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import EncoderDecoderModel

import hf_txvariants  # noqa: F401  (registers the Auto classes)
from hf_txvariants.modeling_vanilla import (
    VanillaForCausalLM,
    VanillaForMaskedLM,
    VanillaForSequenceClassification,
    VanillaModel,
)
from hf_txvariants.training.callbacks import TrainingProgressCallback
from hf_txvariants.training.sliding_window import sliding_window_log_probs
from hf_txvariants.txv_compat import cache_field, output_cache
from tiny_configs import tiny_config
from txv_tester import TxvModelTesterMixin

# this file's tiny model: tiny_config("txv_vanilla") with three layers (Al-Rfou et al.'s per-layer positions and
# intermediate losses reach layers 2 and 3), three future targets and dropout on (the tester checks that evaluation
# turns it off and that gradient checkpointing replays it)
TINY_OVERRIDES = dict(num_hidden_layers=3, num_future_targets=3, dropout=0.1, attention_dropout=0.1)


def vanilla_config(**overrides):
    return tiny_config("txv_vanilla", **{**TINY_OVERRIDES, **overrides})


class TestVanillaDecoder(TxvModelTesterMixin):
    model_type = "txv_vanilla"
    config_overrides = TINY_OVERRIDES
    model_classes = (VanillaModel, VanillaForCausalLM, VanillaForSequenceClassification)
    causal_lm_class = VanillaForCausalLM


@pytest.mark.slow
class TestVanillaPerLayerPositions(TxvModelTesterMixin):
    model_type = "txv_vanilla"
    config_overrides = {**TINY_OVERRIDES, "per_layer_positions": True, "pre_lnorm": True}
    model_classes = (VanillaForCausalLM,)
    causal_lm_class = VanillaForCausalLM


def test_per_layer_positions_are_added_at_each_layer_input():
    """Layer l > 1 sees (output of layer l - 1) + P_l[position], each layer its own table."""
    model = build(per_layer_positions=True)
    x = ids()
    seen, produced = [], []
    handles = [layer.register_forward_pre_hook(lambda m, args: seen.append(args[0])) for layer in model.model.layers]
    handles += [layer.register_forward_hook(lambda m, a, out: produced.append(out[0])) for layer in model.model.layers]
    with torch.no_grad():
        model(x, output_hidden_states=True)
    for handle in handles:
        handle.remove()
    positions = torch.arange(x.shape[1])
    for layer_idx in (1, 2):
        expected = produced[layer_idx - 1] + model.model.layer_positions[layer_idx - 1].weight[positions]
        torch.testing.assert_close(seen[layer_idx], expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="per_layer_positions"):
        vanilla_config(per_layer_positions=True, position_embedding_type="sinusoidal")


@pytest.mark.slow
class TestVanillaSinusoidalEncoder(TxvModelTesterMixin):
    model_type = "txv_vanilla"
    config_overrides = {
        **TINY_OVERRIDES,
        "is_decoder": False,
        "position_embedding_type": "sinusoidal",
        "pre_lnorm": True,
    }
    model_classes = (VanillaModel, VanillaForMaskedLM, VanillaForSequenceClassification)


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    config = vanilla_config(**overrides)
    return VanillaForCausalLM(config).eval()


def ids(batch=2, length=9, seed=0, vocab=23):
    return torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def sinusoids(length, dim):
    """Vaswani et al.'s PE in the [sin | cos] layout, written out: PE(p, k) = sin/cos(p / 10000^(2k/d))."""
    table = torch.zeros(length, dim)
    for p in range(length):
        for k in range(dim // 2):
            angle = p / 10000 ** (2 * k / dim)
            table[p, k] = math.sin(angle)
            table[p, dim // 2 + k] = math.cos(angle)
    return table


@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal"])
@pytest.mark.parametrize("is_decoder", [True, False])
def test_matches_torch_transformer_encoder_layer(position_embedding_type, is_decoder):
    """Post-LN layers equal torch.nn.TransformerEncoderLayer (ReLU, post-norm) with the same weights."""
    torch.manual_seed(0)
    config = vanilla_config(position_embedding_type=position_embedding_type, is_decoder=is_decoder)
    model = VanillaModel(config).eval()
    x = ids()
    reference_layers = []
    for layer in model.layers:
        ref = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True, layer_norm_eps=config.layer_norm_eps)
        attn = layer.self_attn
        with torch.no_grad():
            ref.self_attn.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
            ref.self_attn.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
            ref.self_attn.out_proj.weight.copy_(attn.o_proj.weight)
            ref.self_attn.out_proj.bias.copy_(attn.o_proj.bias)
            ref.linear1.load_state_dict(layer.mlp.CoreNet[0].state_dict())
            ref.linear2.load_state_dict(layer.mlp.CoreNet[3].state_dict())
            ref.norm1.load_state_dict(layer.self_attn_layer_norm.state_dict())
            ref.norm2.load_state_dict(layer.final_layer_norm.state_dict())
        reference_layers.append(ref.eval())
    with torch.no_grad():
        positions = (
            model.embed_positions.weight[: x.shape[1]]
            if position_embedding_type == "learned"
            else sinusoids(x.shape[1], 16)
        )
        hidden = model.embed_tokens(x) + positions
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if is_decoder else None
        for ref in reference_layers:
            hidden = ref(hidden, src_mask=mask, is_causal=is_decoder)
        ours = model(x).last_hidden_state
    torch.testing.assert_close(ours, hidden, atol=1e-5, rtol=0)


def test_cache_incremental_equals_full():
    model = build()
    x = ids(length=10)
    with torch.no_grad():
        full = model(x).logits
        first = model(x[:, :6], use_cache=True)
        second = model(x[:, 6:8], cache=output_cache(first))
        third = model(x[:, 8:], cache=output_cache(second))
    torch.testing.assert_close(torch.cat([first.logits, second.logits, third.logits], 1), full, atol=1e-5, rtol=0)


@pytest.mark.exact
def test_left_padding_equals_row_alone():
    """Positions are counted over real tokens, so a left-padded row gives what it gives alone (also in generate)."""
    model = build()
    x = ids(length=6)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x[:1]], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 6)], dim=1).long()
    with torch.no_grad():
        alone = model(x[:1]).logits
        with_pad = model(padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(with_pad, alone, atol=1e-5, rtol=0)
    batch = torch.cat([padded, torch.cat([ids(1, 3, seed=5), x[1:]], dim=1)])
    batch_mask = torch.cat([mask, torch.ones(1, 9, dtype=torch.long)])
    together = model.generate(batch, attention_mask=batch_mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    single = model.generate(x[:1], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(together[0, 3:], single[0])


def test_learned_positions_beyond_max_are_a_value_error():
    model = build()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(ids(length=40))


def test_loss_on_last_position_only():
    model = build(loss_on_all_positions=False, num_future_targets=1, intermediate_loss_weight=0.0)
    x = ids()
    labels = x.clone()
    labels[1, -2:] = -100  # row 1's last real target is at index 6, predicted from position 5
    output = model(x, labels=labels)
    logits = output.logits
    expected = (
        nn.functional.cross_entropy(logits[0, -2][None], x[0, -1][None])
        + nn.functional.cross_entropy(logits[1, 5][None], x[1, 6][None])
    ) / 2
    torch.testing.assert_close(output.loss, expected)


def test_auxiliary_losses_recomputed_by_hand():
    """Training mode: loss = lm + w_i * sum_l [p < l/2L] CE(layer l) + w_f * sum_n CE(future head n)."""
    model = build(num_hidden_layers=4, intermediate_loss_weight=0.7, future_target_loss_weight=0.5)
    model.train()
    for module in model.modules():  # dropout off, training mode on
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    model.model.layers[0].self_attn.attention_dropout = 0.0
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.0
    x = ids(length=10)

    def ce(logits, offset):
        return nn.functional.cross_entropy(logits[:, :-offset].reshape(-1, 23), x[:, offset:].reshape(-1))

    for progress, active in [(0.0, [1, 2, 3]), (0.2, [2, 3]), (0.3, [3]), (0.4, []), (1.0, [])]:
        model.set_training_progress(progress)
        output = model(x, labels=x, output_hidden_states=True)
        hidden = output.hidden_states  # [embeddings, layer 1 .. layer 4]
        lm = ce(model.lm_head(hidden[-1]), 1)
        intermediate = sum((ce(model.lm_head(hidden[layer]), 1) for layer in active), torch.tensor(0.0))
        future = ce(model.future_heads[0](hidden[-1]), 2) + ce(model.future_heads[1](hidden[-1]), 3)
        torch.testing.assert_close(output.lm_loss, lm)
        torch.testing.assert_close(output.future_loss, future)
        if active:
            torch.testing.assert_close(output.intermediate_loss, intermediate)
        else:
            assert output.intermediate_loss is None
        torch.testing.assert_close(output.loss, lm + 0.7 * intermediate + 0.5 * future)
    model.eval()
    output = model(x, labels=x)
    assert output.future_loss is None and output.intermediate_loss is None
    torch.testing.assert_close(output.loss, output.lm_loss)
    with pytest.raises(ValueError, match="progress"):
        model.set_training_progress(1.5)


def test_training_progress_callback_drives_the_schedule():
    from transformers import TrainerControl, TrainerState

    model = build(num_hidden_layers=4)
    state = TrainerState(max_steps=10, global_step=3)
    TrainingProgressCallback().on_step_begin(None, state, TrainerControl(), model=model)
    assert model.training_progress == 0.3
    assert model.intermediate_layer_weights() == [0.0, 0.0, 1.0]  # layer l counts while progress < l / 8


def test_sliding_window_log_probs(windows_per_batch=4):
    """Each token t >= window is scored from exactly the `window` tokens before it; earlier ones in one pass."""
    model = build()
    x = ids(length=14)
    window = 5
    scores = sliding_window_log_probs(model, x, window, windows_per_batch=windows_per_batch)
    assert scores.shape == (2, 13)
    with torch.no_grad():
        for t in range(1, 14):
            context = x[:, max(0, t - window) : t]
            expected = torch.log_softmax(model(context).logits[:, -1], -1).gather(-1, x[:, t : t + 1])[:, 0]
            torch.testing.assert_close(scores[:, t - 1], expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="window"):
        sliding_window_log_probs(model, x, 1)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="position_embedding_type"):
        vanilla_config(position_embedding_type="rotary")
    with pytest.raises(ValueError, match="hidden_size"):
        vanilla_config(hidden_size=15)
    with pytest.raises(ValueError, match="add_cross_attention"):
        vanilla_config(is_decoder=False, add_cross_attention=True)
    with pytest.raises(ValueError, match="num_future_targets"):
        vanilla_config(num_future_targets=0)
    with pytest.raises(ValueError, match="is_decoder=False"):
        VanillaForMaskedLM(vanilla_config())
    with pytest.raises(ValueError, match="input_ids"):
        build()(torch.full((1, 3), 99))


def make_encoder_decoder(seed=0):
    torch.manual_seed(seed)
    encoder = VanillaModel(vanilla_config(is_decoder=False, position_embedding_type="sinusoidal"))
    decoder = VanillaForCausalLM(vanilla_config(is_decoder=True, add_cross_attention=True))
    model = EncoderDecoderModel(encoder=encoder, decoder=decoder).eval()
    model.config.decoder_start_token_id = 1
    model.config.pad_token_id = 0
    model.generation_config.decoder_start_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


def test_encoder_decoder_model():
    """Inside transformers' EncoderDecoderModel: loss/backward, padding of the source masked, cached decoding equal
    to the full pass, and generate."""
    model = make_encoder_decoder()
    source = ids(2, 7, seed=1)
    source_mask = torch.ones_like(source)
    source_mask[0, 5:] = 0
    target = ids(2, 6, seed=2)
    model.train()
    output = model(input_ids=source, attention_mask=source_mask, labels=target)
    output.loss.backward()
    assert model.decoder.model.layers[0].cross_attn.k_proj.weight.grad is not None
    model.eval()
    with torch.no_grad():
        full = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits
        # changing the padded source tokens changes nothing
        other = source.clone()
        other[0, 5:] = 7
        torch.testing.assert_close(
            model(input_ids=other, attention_mask=source_mask, decoder_input_ids=target).logits, full, atol=1e-5, rtol=0
        )
        encoder_outputs = model.encoder(input_ids=source, attention_mask=source_mask)
        first = model(
            encoder_outputs=encoder_outputs, attention_mask=source_mask, decoder_input_ids=target[:, :4], use_cache=True
        )
        second = model(
            encoder_outputs=encoder_outputs,
            attention_mask=source_mask,
            decoder_input_ids=target[:, 4:],
            **cache_field(output_cache(first)),
            use_cache=True,  # EncoderDecoderModel: the release's own name
        )
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), full, atol=1e-5, rtol=0)
    generated = model.generate(source, attention_mask=source_mask, max_new_tokens=4, do_sample=False)
    assert generated.shape == (2, 5) and bool((generated[:, 0] == 1).all())
