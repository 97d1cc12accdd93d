"""ACT RNN (Graves 2016): the shared tester, the pondering loop against the paper's equations evaluated by hand
(one row, one input step, one update at a time), the state cache, padding, stateful generation and tracing."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

import hf_txvariants  # noqa: F401  (registers the Auto classes)
from hf_txvariants import ACTRNNConfig, ACTRNNForCausalLM, ACTRNNForSequenceClassification, ACTRNNModel
from hf_txvariants.modeling_act_rnn import ACTRNNCache
from hf_txvariants.txv_compat import output_cache
from tiny_configs import tiny_config
from txv_tester import ATOL, TxvModelTesterMixin


class TestACTRNN(TxvModelTesterMixin):
    model_type = "txv_act_rnn"
    model_classes = (ACTRNNModel, ACTRNNForCausalLM, ACTRNNForSequenceClassification)
    causal_lm_class = ACTRNNForCausalLM
    supports_sdpa = False  # no attention


class TestACTRNNLSTM(TestACTRNN):
    """The LSTM cell: the state is (h, c), packed into one tensor for the ACT block."""

    config_overrides = {"rnn_type": "lstm"}


def build(seed=0, model_class=ACTRNNForCausalLM, **overrides):
    torch.manual_seed(seed)
    return model_class(tiny_config("txv_act_rnn", **overrides)).eval()


def naive_cell(model, inputs, state):
    """S(s, x): the tanh RNN written out, s' = tanh(W_ih x + b_ih + W_hh s + b_hh); GRU/LSTM through PyTorch's cell."""
    rnn = model.model.ponder_step.cell.rnn
    if model.config.rnn_type == "tanh":
        return torch.tanh(rnn.weight_ih @ inputs + rnn.bias_ih + rnn.weight_hh @ state + rnn.bias_hh)
    if model.config.rnn_type == "gru":
        return rnn(inputs[None], state[None])[0]
    hidden, cell = rnn(inputs[None], (state[None, : rnn.hidden_size], state[None, rnn.hidden_size :]))
    return torch.cat([hidden[0], cell[0]])


def naive_act_rnn(model, vectors):
    """Graves 2016, eq. (6)-(14), one row, one input step and one update at a time:
    s_t^1 = S(s_{t-1}, [x_t, 1]), s_t^n = S(s_t^{n-1}, [x_t, 0]); h_t^n = sigmoid(W_h s_t^n + b_h);
    N(t) = min(M, min{n' : sum_{n<=n'} h_t^n >= 1 - eps}); R(t) = 1 - sum_{n<N(t)} h_t^n; p_t^n = h_t^n or R(t);
    s_t = sum_n p_t^n s_t^n; y_t = W_y s_t + b_y; rho_t = N(t) + R(t).
    Returns (logits [T, vocab], N [T], rho [T])."""
    config = model.config
    halting = model.model.ponder_step.act.halting
    state = torch.zeros(config.state_size)
    logits, updates, ponder = [], [], []
    for x in vectors:
        total, n, mean_field, candidate = 0.0, 0, torch.zeros_like(state), state
        while True:
            n += 1
            flag = torch.tensor([1.0 if n == 1 else 0.0])
            candidate = naive_cell(model, torch.cat([x, flag]), candidate)
            h = float(torch.sigmoid(halting.weight[0] @ candidate + halting.bias[0]))
            if total + h >= config.act_threshold or n == config.max_ponder_steps:
                remainder = 1.0 - total
                mean_field = mean_field + remainder * candidate
                break
            total += h
            mean_field = mean_field + h * candidate
        state = mean_field
        logits.append(model.lm_head(state[: config.hidden_size]))
        updates.append(float(n))
        ponder.append(n + remainder)
    return torch.stack(logits), torch.tensor(updates), torch.tensor(ponder)


@pytest.mark.parametrize("rnn_type", ["tanh", "gru", "lstm"])
def test_pondering_equals_the_paper_equations(rnn_type):
    model = build(seed=1, rnn_type=rnn_type, halting_bias_init=-1.0)
    ids = torch.randint(1, 23, (3, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output = model(ids, labels=ids)
        for row in range(ids.shape[0]):
            logits, updates, ponder = naive_act_rnn(model, model.model.embed_tokens(ids[row]))
            torch.testing.assert_close(output.logits[row], logits, atol=ATOL, rtol=0)
            torch.testing.assert_close(output.n_updates[row], updates)
            torch.testing.assert_close(output.ponder_cost[row], ponder, atol=ATOL, rtol=0)
    assert output.n_updates.unique().numel() > 1, "expected input steps with different numbers of updates here"
    # loss = L + tau * mean_t rho_t  (the per-token mean of the paper's L + tau * sum_t rho_t)
    expected = output.lm_loss + model.config.act_loss_weight * output.ponder_cost.mean()
    torch.testing.assert_close(output.loss, expected)


def test_max_ponder_steps_bounds_the_updates_and_forces_the_remainder():
    model = build(halting_bias_init=-8.0, max_ponder_steps=3)  # h ~ 0: every step runs to M
    with torch.no_grad():
        model.model.ponder_step.act.halting.weight.zero_()
        output = model(torch.tensor([[3, 4, 5]]))
    assert output.n_updates.eq(3).all()
    h = torch.sigmoid(torch.tensor(-8.0))
    torch.testing.assert_close(output.ponder_cost, torch.full((1, 3), 3 + (1 - 2 * h.item())))


def test_ponder_cost_gradient_reaches_the_halting_unit():
    model = build().train()
    output = model(torch.tensor([[3, 4, 5, 6]]))
    output.ponder_cost.sum().backward()
    assert model.model.ponder_step.act.halting.weight.grad.abs().sum() > 0


def test_state_cache_continues_the_sequence_exactly():
    model = build(seed=2, halting_bias_init=0.0)
    ids = torch.randint(1, 23, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids)
        first = model(ids[:, :5], use_cache=True)
        assert isinstance(output_cache(first), ACTRNNCache) and output_cache(first).get_seq_length() == 5
        second = model(ids[:, 5:], cache=output_cache(first), use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), full.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat([first.n_updates, second.n_updates], 1), full.n_updates)


def test_left_padding_keeps_the_state_and_costs_nothing():
    model = build(seed=2, halting_bias_init=0.0)
    row = torch.tensor([[5, 6, 7]])
    padded = torch.tensor([[0, 0, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    with torch.no_grad():
        alone, together = model(row), model(padded, attention_mask=mask)
    torch.testing.assert_close(together.logits[:, 2:], alone.logits, atol=ATOL, rtol=0)
    assert together.ponder_cost[0, :2].eq(0).all()


@pytest.mark.exact
def test_generate_with_the_state_equals_without_and_left_padding_equals_rows_alone():
    model = build(seed=2, halting_bias_init=0.0)
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    prompt = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    cached = model.generate(prompt, attention_mask=mask, **kwargs)
    assert torch.equal(cached, model.generate(prompt, attention_mask=mask, use_cache=False, **kwargs))
    alone = model.generate(torch.tensor([[9, 10]]), **kwargs)
    assert torch.equal(cached[1, -4:], alone[0, -4:])
    beams = model.generate(prompt, attention_mask=mask, num_beams=2, **kwargs)
    assert torch.equal(beams, model.generate(prompt, attention_mask=mask, num_beams=2, use_cache=False, **kwargs))


@pytest.mark.exact
def test_generate_from_inputs_embeds_equals_generate_from_input_ids():
    model = build(seed=2, halting_bias_init=0.0)
    prompt = torch.tensor([[5, 6, 7, 8], [3, 9, 10, 11]])
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    from_ids = model.generate(prompt, **kwargs)
    from_embeddings = model.generate(inputs_embeds=model.get_input_embeddings()(prompt).detach(), **kwargs)
    assert torch.equal(from_embeddings, from_ids[:, 4:])


def test_assisted_decoding_is_refused_because_the_model_is_stateful():
    model = build()
    with pytest.raises(ValueError, match="stateful"):
        model.generate(torch.tensor([[5, 6, 7]]), assistant_model=build(seed=1), max_new_tokens=2, pad_token_id=0)


def test_output_attentions_is_a_clear_error():
    with pytest.raises(ValueError, match="no attention"):
        build()(torch.tensor([[1, 2]]), output_attentions=True)


def test_shift_labels_are_the_targets_when_given():
    model = build()
    ids = torch.randint(1, 23, (2, 5), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(1, 23, (2, 5), generator=torch.Generator().manual_seed(1))
    output = model(ids, labels=ids, shift_labels=targets)
    torch.testing.assert_close(
        output.lm_loss, nn.functional.cross_entropy(output.logits.reshape(-1, 23), targets.reshape(-1))
    )


def test_sequence_classification_reads_the_vectors_of_the_parity_task():
    """The paper's parity setting: one input vector per sequence (`inputs_embeds`), a classifier on s_1."""
    model = build(model_class=ACTRNNForSequenceClassification, embedding_size=16, num_labels=2)
    vectors = torch.randint(-1, 2, (4, 1, 16)).float()
    output = model(inputs_embeds=vectors, labels=torch.tensor([0, 1, 1, 0]))
    assert output.logits.shape == (4, 2) and output.n_updates.shape == (4, 1)
    torch.testing.assert_close(
        output.loss,
        nn.functional.cross_entropy(output.logits, torch.tensor([0, 1, 1, 0]))
        + model.config.act_loss_weight * output.ponder_cost.mean(),
    )


@pytest.mark.parametrize("model_class", [ACTRNNForCausalLM, ACTRNNForSequenceClassification])
@pytest.mark.slow  # torch.export and torch.compile
def test_torch_export_and_compile_fullgraph_trace_the_model(model_class):
    model = build(seed=2, model_class=model_class, halting_bias_init=0.0)
    ids = torch.randint(1, 23, (2, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
        exported = torch.export.export(model, (ids,)).module()(ids)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")(ids)
    for traced in (exported, compiled):
        torch.testing.assert_close(traced.logits, expected.logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(traced.n_updates, expected.n_updates)


def test_auto_classes_and_paper_names():
    config = ACTRNNConfig(vocab_size=11, hidden_size=8, time_penalty=0.01, max_steps=7, act_epsilon=0.05)
    assert (config.act_loss_weight, config.max_ponder_steps, config.embedding_size) == (0.01, 7, 8)
    assert config.act_threshold == pytest.approx(0.95)
    assert isinstance(AutoModelForCausalLM.from_config(config), ACTRNNForCausalLM)
    assert isinstance(AutoModelForSequenceClassification.from_config(config), ACTRNNForSequenceClassification)


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("rnn_type", {"rnn_type": "elman"}),
        ("max_ponder_steps", {"max_ponder_steps": 0}),
        ("act_threshold", {"act_epsilon": 1.5}),
        ("act_loss_weight", {"time_penalty": -1.0}),
        ("embedding_size", {"embedding_size": 0}),
        ("dropout", {"dropout": 1.0}),
    ],
)
def test_bad_config_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_act_rnn", **kwargs)


def test_bad_input_names_the_tensor():
    model = build()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 1))
    with pytest.raises(ValueError, match="ACTRNNCache"):
        model(torch.tensor([[1, 2]]), cache=torch.zeros(1))
