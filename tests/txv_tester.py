"""The shared model tester, in the spirit of transformers' ModelTesterMixin.

A variant's test file subclasses `TxvModelTesterMixin` and sets:
    model_type (its tiny config is `tiny_configs.tiny_config(model_type, **config_overrides)`), config_overrides
    (dict), model_classes (base model first), causal_lm_class (or None)
    has_memory: XL-family memory carried as past_key_values (MemoryCache)
    memory_test_config_kwargs: overrides under which "segment 2 with the memory of segment 1" equals one pass
    supports_sdpa, vocab_size_for_inputs, batch_size, seq_length
and may override `make_inputs(config)`. Every check runs on CPU, in float32, with dropout off unless said otherwise.
That each tester's saved folder loads as remote code without the plugin is checked for all testers at once, in one
clean subprocess (`load_without_plugin`, tests/test_remote_code.py).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from hf_txvariants.txv_compat import output_cache
from tiny_configs import config_class, tiny_config

REPO_ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-5


def first_tensor(output):
    """The main tensor of a model output: logits if present, else the last hidden state."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    raise AssertionError(f"no logits or last_hidden_state in {type(output).__name__}")


class TxvModelTesterMixin:
    model_type: str = ""
    config_overrides: dict = {}
    model_classes: tuple = ()
    causal_lm_class = None
    has_memory = False
    memory_test_config_kwargs: dict = {}
    supports_sdpa = True
    batch_size = 3
    seq_length = 7

    # ------------------------------------------------------------------------------------------------ helpers
    @property
    def config_class(self):
        return config_class(self.model_type)

    def make_config(self, **overrides):
        return tiny_config(self.model_type, **{**self.config_overrides, **overrides})

    def make_inputs(self, config, batch_size=None, seq_length=None, seed=0):
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size or self.batch_size, seq_length or self.seq_length)
        return {"input_ids": torch.randint(0, config.vocab_size, shape, generator=generator)}

    def build(self, model_class, config=None, seed=0):
        torch.manual_seed(seed)
        model = model_class(config or self.make_config())
        return model.eval()

    @staticmethod
    def run(model, **inputs):
        with torch.no_grad():
            return model(**inputs)

    # ------------------------------------------------------------------------------------------------ config
    def test_config_round_trip(self, tmp_path):
        config = self.make_config()
        config.save_pretrained(tmp_path)
        reloaded = AutoConfig.from_pretrained(tmp_path)
        assert type(reloaded) is self.config_class
        without_path = lambda c: {k: v for k, v in c.to_dict().items() if k != "_name_or_path"}  # noqa: E731
        assert without_path(reloaded) == without_path(config)
        assert self.config_class.from_dict(config.to_dict()).to_dict() == config.to_dict()

    def test_config_paper_names(self):
        config = self.make_config()
        for alias, standard in self.config_class.attribute_map.items():
            assert getattr(config, alias) == getattr(config, standard)

    # ------------------------------------------------------------------------------------------------ save / load
    def test_save_load_round_trip(self, tmp_path):
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            model = self.build(model_class, config)
            expected = first_tensor(self.run(model, **inputs))
            folder = tmp_path / model_class.__name__
            model.save_pretrained(folder)
            assert (folder / "model.safetensors").exists()
            reloaded = model_class.from_pretrained(folder).eval()
            torch.testing.assert_close(first_tensor(self.run(reloaded, **inputs)), expected, atol=ATOL, rtol=0)
            auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
            assert set(type(model).auto_classes) | {"AutoConfig"} == set(auto_map)

    def test_from_state_dict(self):
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            model = self.build(model_class, config, seed=0)
            other = self.build(model_class, config, seed=1)
            other.load_state_dict(model.state_dict())
            torch.testing.assert_close(
                first_tensor(self.run(other, **inputs)), first_tensor(self.run(model, **inputs)), atol=ATOL, rtol=0
            )

    def test_every_parameter_initialised(self):
        """`_init_weights` must cover every parameter and buffer: build on the meta device, fill with NaN, init."""
        config = self.make_config()
        for model_class in self.model_classes:
            with torch.device("meta"):
                model = model_class(config)
            model.to_empty(device="cpu")
            with torch.no_grad():
                for tensor in list(model.parameters()) + list(model.buffers()):
                    if tensor.is_floating_point():
                        tensor.fill_(float("nan"))
            for module in model.modules():
                module.__dict__.pop("_is_hf_initialized", None)
            for tensor in list(model.parameters()) + list(model.buffers()):
                tensor.__dict__.pop("_is_hf_initialized", None)
            model.init_weights()
            bad = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.isnan().any()]
            assert not bad, f"{model_class.__name__}: not initialised by _init_weights: {bad}"

    # ------------------------------------------------------------------------------------------------ forward
    @pytest.mark.exact
    def test_determinism(self):
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            model = self.build(model_class, config)
            first = first_tensor(self.run(model, **inputs))
            second = first_tensor(self.run(model, **inputs))
            assert torch.equal(first, second)
            assert torch.isfinite(first).all()

    def test_batch_equals_rows(self):
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            model = self.build(model_class, config)
            batched = first_tensor(self.run(model, **inputs))
            for row in range(batched.shape[0]):
                single = {k: v[row : row + 1] for k, v in inputs.items()}
                torch.testing.assert_close(first_tensor(self.run(model, **single))[0], batched[row], atol=ATOL, rtol=0)

    @pytest.mark.exact
    def test_tuple_equals_dict(self):
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            model = self.build(model_class, config)
            as_dict = self.run(model, **inputs, return_dict=True)
            as_tuple = self.run(model, **inputs, return_dict=False)
            assert isinstance(as_tuple, tuple)
            tensors = [v for v in as_dict.to_tuple() if isinstance(v, torch.Tensor)]
            tuple_tensors = [v for v in as_tuple if isinstance(v, torch.Tensor)]
            assert len(tensors) == len(tuple_tensors)
            for a, b in zip(tensors, tuple_tensors):
                assert torch.equal(a, b)

    def test_inputs_embeds_equals_input_ids(self):
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            model = self.build(model_class, config)
            if "inputs_embeds" not in inspect.signature(model.forward).parameters:
                continue
            embeddings = model.get_input_embeddings()(inputs["input_ids"]).detach()
            rest = {k: v for k, v in inputs.items() if k != "input_ids"}
            torch.testing.assert_close(
                first_tensor(self.run(model, inputs_embeds=embeddings, **rest)),
                first_tensor(self.run(model, **inputs)),
                atol=ATOL,
                rtol=0,
            )

    def test_eager_equals_sdpa(self):
        if not self.supports_sdpa:
            pytest.skip("this variant has no SDPA path")
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            eager = self.build(model_class, config)
            eager.set_attn_implementation("eager")
            sdpa = self.build(model_class, config)
            sdpa.set_attn_implementation("sdpa")
            calls = []
            original = torch.nn.functional.scaled_dot_product_attention

            def counting_sdpa(*args, calls=calls, original=original, **kwargs):
                calls.append(1)
                return original(*args, **kwargs)

            torch.nn.functional.scaled_dot_product_attention = counting_sdpa
            try:
                sdpa_output = first_tensor(self.run(sdpa, **inputs))
            finally:
                torch.nn.functional.scaled_dot_product_attention = original
            assert calls, f"{model_class.__name__} with attn_implementation='sdpa' never called SDPA"
            torch.testing.assert_close(sdpa_output, first_tensor(self.run(eager, **inputs)), atol=ATOL, rtol=0)

    # ------------------------------------------------------------------------------------------------ training
    def training_loss(self, model, inputs):
        if "labels" in inspect.signature(model.forward).parameters and self.causal_lm_class is type(model):
            return model(**inputs, labels=inputs["input_ids"]).loss
        output = model(**inputs)
        return first_tensor(output).float().pow(2).mean()

    def test_every_parameter_gets_a_gradient(self):
        config = self.make_config()
        inputs = self.make_inputs(config)
        for model_class in self.model_classes:
            model = self.build(model_class, config).train()
            self.training_loss(model, inputs).backward()
            missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            assert not missing, f"{model_class.__name__}: no gradient for {missing}"
            bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
            assert not bad, f"{model_class.__name__}: non-finite gradient for {bad}"

    def test_gradient_checkpointing_equals_plain(self):
        config = self.make_config()
        inputs = self.make_inputs(config)
        model_class = self.causal_lm_class or self.model_classes[0]
        plain = self.build(model_class, config).train()
        checkpointed = self.build(model_class, config).train()
        checkpointed.activation_checkpointing_enable()
        assert checkpointed.is_activation_checkpointing
        torch.manual_seed(0)
        plain_loss = self.training_loss(plain, inputs)
        plain_loss.backward()
        torch.manual_seed(0)
        checkpointed_loss = self.training_loss(checkpointed, inputs)
        checkpointed_loss.backward()
        torch.testing.assert_close(checkpointed_loss, plain_loss, atol=ATOL, rtol=0)
        for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
            if a.grad is not None:
                torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)

    # ------------------------------------------------------------------------------------------------ memory
    def test_memory_incremental_equals_full_context(self):
        """Processing segment 2 with the memory of segment 1 gives the outputs of one pass over both segments."""
        if not self.has_memory:
            pytest.skip("no segment memory")
        config = self.make_config(**self.memory_test_config_kwargs)
        model_class = self.causal_lm_class or self.model_classes[0]
        model = self.build(model_class, config)
        ids = self.make_inputs(config, seq_length=2 * self.seq_length)["input_ids"]
        full = first_tensor(self.run(model, input_ids=ids))
        first = self.run(model, input_ids=ids[:, : self.seq_length])
        second = self.run(model, input_ids=ids[:, self.seq_length :], cache=output_cache(first))
        torch.testing.assert_close(first_tensor(first), full[:, : self.seq_length], atol=ATOL, rtol=0)
        torch.testing.assert_close(first_tensor(second), full[:, self.seq_length :], atol=ATOL, rtol=0)

    # ------------------------------------------------------------------------------------------------ generation
    @pytest.mark.exact
    @pytest.mark.parametrize("attention", ["default", "eager"])
    def test_generate_smoke(self, attention):
        """Greedy, sampled and beam generation on the attention implementation a user gets (the default), and on
        eager where the variant has another: eager then generates the default's greedy tokens."""
        if self.causal_lm_class is None:
            pytest.skip("no causal LM head")
        if attention == "eager" and not self.supports_sdpa:
            pytest.skip("eager is the only attention this variant's default runs: the default case covers it")
        config = self.make_config()
        model = self.build(self.causal_lm_class, config)
        prompt = self.make_inputs(config, batch_size=2, seq_length=4)["input_ids"]
        kwargs = dict(max_new_tokens=3, pad_token_id=0, eos_token_id=None)
        if attention == "eager":
            default_greedy = model.generate(prompt, do_sample=False, **kwargs)
            model.set_attn_implementation("eager")
            assert model.config._attn_implementation == "eager"
        greedy = model.generate(prompt, do_sample=False, **kwargs)
        assert greedy.shape == (2, 7) and torch.equal(greedy[:, :4], prompt)
        if attention == "eager":
            assert torch.equal(greedy, default_greedy)
        sampled = model.generate(prompt, do_sample=True, top_k=5, **kwargs)
        assert sampled.shape == (2, 7)
        beams = model.generate(prompt, num_beams=2, do_sample=False, **kwargs)
        assert beams.shape == (2, 7)


# One clean process for the folders of every tester: the plugin cannot be imported there, and each folder's code is
# loaded as its own remote module (folders have distinct names: the module transformers makes is named after it).
LOAD_WITHOUT_PLUGIN = """
import sys, traceback
sys.modules["hf_txvariants"] = None  # any import of the plugin fails
import torch, transformers
for folder, auto_name in CASES:
    try:
        inputs = torch.load(folder + ".inputs.pt", weights_only=True)
        model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
        assert not type(model).__module__.startswith("hf_txvariants"), type(model).__module__
        with torch.no_grad():
            output = model(**inputs)
        tensor = output.logits if getattr(output, "logits", None) is not None else output.last_hidden_state
        torch.save(tensor, folder + ".output.pt")
    except Exception:
        with open(folder + ".error.txt", "w") as file:
            file.write(traceback.format_exc())
"""


def load_without_plugin(testers, folder: Path) -> dict:
    """For every tester class: `(expected, loaded)`, where `expected` is the output of its causal LM (or base model),
    built and run here and saved under `folder`, and `loaded` the output of that folder loaded with
    trust_remote_code=True in ONE clean subprocess for all of them (or, where that failed, the error as text)."""
    cases, expected = [], {}
    for tester_class in testers:
        tester = tester_class()
        config = tester.make_config()
        inputs = tester.make_inputs(config)
        model = tester.build(tester.causal_lm_class or tester.model_classes[0], config)
        expected[tester_class] = first_tensor(tester.run(model, **inputs))
        case = str(folder / f"{tester_class.__module__}_{tester_class.__name__}")
        model.save_pretrained(case)
        torch.save(inputs, case + ".inputs.pt")
        cases.append((case, "AutoModelForCausalLM" if tester.causal_lm_class else "AutoModel"))
    script = f"CASES = {cases!r}\n" + LOAD_WITHOUT_PLUGIN
    env = {**os.environ, "HF_MODULES_CACHE": str(folder / "modules"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=1200
    )
    outputs = {}
    for tester_class, (case, _) in zip(testers, cases):
        output, error = Path(case + ".output.pt"), Path(case + ".error.txt")
        if output.exists():
            loaded = torch.load(output, weights_only=True)
        elif error.exists():
            loaded = error.read_text()[-3000:]
        else:  # the process stopped before this folder
            loaded = f"exit status {result.returncode}: {result.stderr[-3000:]}"
        outputs[tester_class] = (expected[tester_class], loaded)
    return outputs


def all_testers() -> list[type]:
    """Every shared-tester class of the suite: the test modules that use the tester are imported (each once: pytest
    imports them under the same names), and the subclasses collected."""
    import importlib

    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if "(TxvModelTesterMixin)" in path.read_text():
            importlib.import_module(path.stem)
    testers, pending = [], list(TxvModelTesterMixin.__subclasses__())
    while pending:
        tester = pending.pop(0)
        testers.append(tester)
        pending += tester.__subclasses__()
    return sorted(set(testers), key=lambda tester: (tester.__module__, tester.__name__))
