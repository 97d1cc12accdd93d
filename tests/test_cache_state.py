"""The caches' one state protocol: every cache gives its content as plain tensors, ints and strings (`to_state`, read
back by `torch.load(weights_only=True)`) and is made again from it (`from_state`); every model makes its first cache
with `initial_cache`. Checkpoints, RL snapshots and the pytree registration go through it, and the forms saved before
it still load (tests/fixtures/memory_states_fcdd311, made by tests/fixtures/make_memory_state_fixtures.py from the
code of commit fcdd311).

Tolerance where a restored cache continues: the restored memory holds the same vectors, but the cache it came from
may reuse the keys and values it kept (the XL family in evaluation) where the restored one recomputes them from the
memory: the same products in another grouping, equal within float32 rounding (about 1e-7 here). 1e-6 fails on any
real difference (a lost slot or mask entry moves these logits by more than 1e-2)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from hf_txvariants.training.models import (
    ModelError,
    init_memory,
    memory_batch_size,
    memory_state,
    restore_memory,
    uses_memory,
)
from hf_txvariants.txv_compat import output_cache
from tiny_configs import model_class, tiny_config

TOLERANCE = dict(atol=1e-6, rtol=1e-6)
FIXTURES = Path(__file__).parent / "fixtures" / "memory_states_fcdd311"

# every variant whose causal LM keeps a cache of its own, with what its cache needs here
CACHED = {
    "transfo-xl": {},
    "txv_gtrxl": dict(memory_init="zeros"),
    "txv_adaptive_span": {},
    "txv_adaptive_span_original": {},
    "txv_universal": {},
    "txv_act_rnn": {},
    "txv_reformer": {},
    "txv_r_transformer": {},  # a DynamicCache of keys/values with the LocalRNN prefixes, on the same protocol
}


def _lm(model_type: str):
    torch.manual_seed(0)
    return model_class(model_type, "AutoModelForCausalLM")(tiny_config(model_type, **CACHED[model_type])).eval()


def _ids(model, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))


def _through_a_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _assert_same_state(actual: dict, expected: dict):
    """The same entries: tensors equal in dtype and value (lists of them entry by entry), everything else equal."""
    assert actual.keys() == expected.keys()
    for name, want in expected.items():
        got = actual[name]
        if isinstance(want, (list, tuple)):
            assert isinstance(got, (list, tuple)) and len(got) == len(want), name
            pairs = list(zip(got, want))
        else:
            pairs = [(got, want)]
        for a, b in pairs:
            if isinstance(b, torch.Tensor):
                assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), name
            else:
                assert a == b, name


def _continue(model, cache, ids):
    """The logits of one more token per row from `cache` (a one-token call: the XL family's step door)."""
    with torch.no_grad():
        return model(ids, cache=cache, use_cache=True).logits


@pytest.mark.parametrize("model_type", sorted(CACHED))
def test_every_cache_round_trips_through_its_state_and_a_weights_only_file(model_type):
    """A cache made again from its state (saved and read back with `weights_only=True`) holds the same state and gives
    the next token the logits the cache it came from gives."""
    model = _lm(model_type)
    prompt, next_token = _ids(model, 6), _ids(model, 1, seed=2)
    with torch.no_grad():
        cache = output_cache(model(prompt, use_cache=True))
    state = cache.to_state()
    restored = type(cache).from_state(_through_a_file(state))
    _assert_same_state(restored.to_state(), state)
    torch.testing.assert_close(_continue(model, restored, next_token), _continue(model, cache, next_token), **TOLERANCE)


@pytest.mark.parametrize("model_type", sorted(CACHED))
def test_initial_cache_is_the_cache_the_model_returns(model_type):
    """One name for the first cache of every model that keeps one: `initial_cache`, of the class its forward returns;
    a model whose cache is a memory carried from segment to segment (`carries_memory`) is the one training carries."""
    model = _lm(model_type)
    with torch.no_grad():
        returned = output_cache(model(_ids(model, 3), use_cache=True))
    assert type(model.base_model.initial_cache(2)) is type(returned)
    carries = model_type in ("transfo-xl", "txv_gtrxl", "txv_adaptive_span", "txv_adaptive_span_original")
    assert uses_memory(model) is carries
    if carries:
        assert type(model.initial_cache(2)) is type(returned)
        assert type(init_memory(model, 2)) is type(returned)


def test_a_state_that_does_not_fit_is_refused_by_name():
    model = _lm("txv_gtrxl")
    state = model.initial_cache(2).to_state()
    cache_class = type(model.initial_cache(2))
    with pytest.raises(ValueError, match="the MemoryCache state lacks memory_mask"):
        cache_class.from_state({name: value for name, value in state.items() if name != "memory_mask"})
    with pytest.raises(ValueError, match=r"`memory` must be \[batch, layers=2, length, hidden\], got \(2, 8, 16\)"):
        cache_class.from_state({**state, "memory": state["memory"][:, 0]})
    with pytest.raises(ValueError, match="must be the dict its to_state"):
        cache_class.from_state([state["memory"]])


@pytest.mark.exact  # the leaves are the state's own tensors: no arithmetic between them
def test_the_pytree_registration_flattens_the_state():
    """torch.export and torch.compile see the memory through its state: its tensors as leaves, the rest as the
    context, and the unflattened cache holds the same state."""
    model = _lm("transfo-xl")
    with torch.no_grad():
        cache = output_cache(model(_ids(model, 7), use_cache=True))
    leaves, spec = torch.utils._pytree.tree_flatten(cache)
    state = cache.to_state()
    assert len(leaves) == 2 and torch.equal(leaves[0], state["memory"]) and torch.equal(leaves[1], state["memory_mask"])
    _assert_same_state(torch.utils._pytree.tree_unflatten(leaves, spec).to_state(), state)


@pytest.mark.parametrize("model_type", sorted(path.name for path in FIXTURES.iterdir() if path.is_dir()))
def test_a_checkpoint_memory_file_written_before_the_state_protocol_still_restores(model_type):
    """memory_rank0.pt of a checkpoint of commit fcdd311 (a MemoryCache as its tuple, a SpanCache as its dict), read
    with weights_only=True: restored into today's cache, the next segment gives the logits the old code computed from
    the memory it saved. What restores it is `restore_memory` (`upgrade_memory_state`), as `load_checkpoint` and
    MemoryTrainer call it."""
    reference = torch.load(FIXTURES / model_type / "reference.pt", weights_only=True)
    (saved,) = torch.load(FIXTURES / model_type / "memory_rank0.pt", weights_only=True)
    assert isinstance(saved, tuple if model_type != "txv_adaptive_span_original" else dict)  # the old forms
    config_dict = json.loads(reference["config"])
    config = type(tiny_config(model_type)).from_dict(config_dict)
    model = model_class(model_type, "AutoModelForCausalLM")(config).eval()
    model.load_state_dict(reference["weights"])
    ids = reference["ids"]
    memory = restore_memory(init_memory(model, memory_batch_size(saved)), saved, "the fixture")
    assert memory.get_seq_length() == 6
    with torch.no_grad():
        logits = model(ids[:, 6:], cache=memory, use_cache=True).logits
    torch.testing.assert_close(logits, reference["logits"], **TOLERANCE)
    # and saved again, it is today's form: the cache's own state
    assert memory_state(memory).keys() == memory.to_state().keys()


def test_a_memory_saved_for_another_model_is_refused_naming_the_checkpoint():
    gtrxl, transfo_xl = _lm("txv_gtrxl"), _lm("transfo-xl")
    with torch.no_grad():
        cache = output_cache(transfo_xl(_ids(transfo_xl, 6), use_cache=True))
    with pytest.raises(ModelError, match="the memory saved in step-3 does not fit this model: .*'transfo-xl' model"):
        restore_memory(init_memory(gtrxl, 2), memory_state(cache), "step-3")


def test_an_rl_snapshot_taken_before_the_state_protocol_still_restores():
    """A `MemoryPolicy.snapshot` of commit fcdd311 (its memory and mask, batch first), read with weights_only=True:
    restored by today's policy, the next step's logits and values are the old code's."""
    pytest.importorskip("gymnasium")
    from hf_txvariants.rl import MemoryPolicy

    saved = torch.load(FIXTURES / "rl_snapshot.pt", weights_only=True)
    policy = MemoryPolicy.from_config(json.loads(saved["config"])).eval()
    policy.load_state_dict(saved["weights"])
    assert set(saved["snapshot"]) == {"memory", "memory_mask"}
    state = policy.restore(saved["snapshot"])
    with torch.no_grad():
        out = policy(saved["observations"][:, None], state, saved["starts"][:, None])
    torch.testing.assert_close(out.logits, saved["logits"], **TOLERANCE)
    torch.testing.assert_close(out.values, saved["values"], **TOLERANCE)
    _assert_same_state(policy.snapshot(policy.restore(saved["snapshot"])), saved["snapshot"])


def test_an_r_transformer_state_that_does_not_fit_is_refused_by_name():
    model = _lm("txv_r_transformer")
    with torch.no_grad():
        cache = output_cache(model(_ids(model, 4), use_cache=True))
    state = cache.to_state()
    assert len(state["keys"]) == model.config.num_hidden_layers
    assert state["rnn_prefix_layers"] == [list(key) for key in cache.rnn_prefixes]
    cache_class = type(cache)
    with pytest.raises(ValueError, match="the RTransformerCache state lacks rnn_prefixes"):
        cache_class.from_state({name: value for name, value in state.items() if name != "rnn_prefixes"})
    with pytest.raises(ValueError, match="rnn_prefix_layers for"):
        cache_class.from_state({**state, "rnn_prefixes": state["rnn_prefixes"][:-1]})
    with pytest.raises(ValueError, match="must be the dict its to_state"):
        cache_class.from_state([state["keys"]])
