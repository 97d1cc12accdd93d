"""Building a causal language model of any registered variant, by name and size or from a checkpoint, and the
uniform way the training code talks to it (with or without a Transformer-XL memory)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..txv_compat import output_cache
from ..txv_precision import at_least_float32


class ModelError(ValueError):
    """Bad model request (unknown variant, unreadable checkpoint ...); the CLI prints its message on one line."""


def variant_names() -> list[str]:
    import hf_txvariants

    return sorted(hf_txvariants.VARIANTS)


# Variants registered for another modality: `txv train` / `txv eval` (character and word text) refuse them.
NON_TEXT_VARIANTS = {"txv_image_transformer": "an image model (pixels); see examples/train_image_transformer.py"}


def text_variant_names() -> list[str]:
    return [name for name in variant_names() if name not in NON_TEXT_VARIANTS]


def check_text_variant(variant: str):
    config_class(variant)  # unknown names first
    if variant in NON_TEXT_VARIANTS:
        raise ModelError(
            f"variant {variant!r} is {NON_TEXT_VARIANTS[variant]}, not a text language model; "
            f"text variants: {', '.join(text_variant_names())}"
        )


def has_variant(name: str) -> bool:
    return name in variant_names()


def config_class(variant: str):
    import hf_txvariants

    if variant not in hf_txvariants.VARIANTS:
        raise ModelError(f"unknown variant {variant!r}; registered variants: {', '.join(variant_names())}")
    return hf_txvariants.VARIANTS[variant][0]


def build_config(
    variant: str,
    vocab_size: int,
    d_model: int = 128,
    n_layer: int = 4,
    n_head: int = 4,
    d_inner: int | None = None,
    mem_len: int = 64,
    seg_len: int = 64,
    dropout: float = 0.1,
    **extra,
):
    """A config of `variant` with the given size. Transformer-XL gets `cutoffs=[]` (plain softmax, right for
    characters), `memory_init="empty"` and `clamp_len=-1`; variants with absolute positions get
    `max_position_embeddings=seg_len` (their own default position type: for txv_vanilla, learned positions, whose
    small initial scale matches the token embeddings; unscaled sinusoids of norm ~1 drown them). Variant-specific
    fields can be passed as `extra`."""
    cls = config_class(variant)
    fields = set(getattr(cls, "__dataclass_fields__", {})) | set(getattr(cls, "attribute_map", {}))
    kwargs = dict(vocab_size=vocab_size, hidden_size=d_model, dropout=dropout)
    # The size fields a variant has (the ACT RNN has no layers, heads or feed-forward).
    for name, value in (
        ("num_hidden_layers", n_layer),
        ("num_attention_heads", n_head),
        ("intermediate_size", d_inner or 4 * d_model),
    ):
        if name in fields:
            kwargs[name] = value
    if "mem_len" in fields:
        kwargs["mem_len"] = mem_len
    if "same_length" in fields:
        kwargs["same_length"] = False
    if "clamp_len" in fields:
        kwargs["clamp_len"] = -1
    if "memory_init" in fields:
        kwargs["memory_init"] = "empty"
    if "cutoffs" in fields:
        kwargs["cutoffs"] = []
    if "max_position_embeddings" in fields:
        kwargs["max_position_embeddings"] = seg_len
    kwargs.update(extra)
    unknown = sorted(k for k in kwargs if k not in fields and not hasattr(cls, k))
    if unknown:
        raise ModelError(f"variant {variant!r} has no config field(s) {unknown}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as error:
        raise ModelError(f"invalid {variant} config: {error}") from None


def build_model(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config)


def _looks_like_a_path(name: str) -> bool:
    """A Hub repo id is `name` or `owner/name`; anything else that does not exist is a missing folder."""
    return Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name


def check_model_source(name: str | Path):
    """A saved-model folder must exist and hold a readable config.json of a registered model type (a name that is
    not a folder is taken as a Hub repo id)."""
    import json

    from transformers import CONFIG_MAPPING

    name = str(name)
    folder = Path(name)
    if not folder.exists():
        if _looks_like_a_path(name):
            raise ModelError(f"model folder not found: {name}")
        return
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{name} is not a saved model (no config.json)")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelError(f"{config_file} is not valid JSON ({error})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type is None or model_type not in CONFIG_MAPPING:
        raise ModelError(
            f"{config_file}: unknown model_type {model_type!r} (hf-txvariants registers {', '.join(variant_names())})"
        )


def load_model(path: str | Path, **kwargs):
    """A causal LM and its config from a saved folder (or Hub repo id), with a clear message when it cannot: a missing
    folder, a folder without config.json, an unsafe pickle (refused by the weights-only loader, never run), a torn
    weights file, an offline Hub. `kwargs` go to `from_pretrained` (e.g. dtype)."""
    import pickle

    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    import hf_txvariants  # noqa: F401  (registers the variants)

    name = str(path)
    check_model_source(name)
    try:
        return AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError, SafetensorError) as error:
        raise ModelError(f"could not load a causal LM from {name}: {_first_line(error)}") from None
    except RuntimeError as error:  # torch's readers raise RuntimeError for a torn file (e.g. a truncated zip)
        raise ModelError(
            f"could not load a causal LM from {name}: the weights are unreadable ({_first_line(error)})"
        ) from None


def load_tokenizer(path: str | Path):
    """The tokenizer saved with a model (a folder or Hub repo id), with a one-line ModelError when there is none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise ModelError(f"no tokenizer in {path}: {str(error).splitlines()[0]}") from None


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def unwrapped(model):
    """The model inside a DistributedDataParallel-style wrapper (`.module`), or the model itself."""
    return getattr(model, "module", model)


def _memory_owner(model):
    """The module that makes the memory a training stream carries from one segment to the next, or None: the LM head
    model or its base model, whichever `carries_memory` (the XL family with `mem_len` > 0: a `MemoryCache`; the
    original adaptive-span model: a `SpanCache`)."""
    model = unwrapped(model)
    for candidate in (model, getattr(model, "base_model", None)):
        if candidate is not None and getattr(candidate, "carries_memory", False):
            return candidate
    return None


def uses_memory(model) -> bool:
    return _memory_owner(model) is not None


def init_memory(model, batch_size: int):
    """The memory a stream of `batch_size` rows starts with (None for models without one): `initial_cache`."""
    owner = _memory_owner(model)
    return None if owner is None else owner.initial_cache(batch_size)


def memory_state(memory):
    """What a checkpoint keeps of a memory: the cache's `to_state()` (plain tensors, ints and strings, so that
    `torch.load(weights_only=True)` reads it), or None without a memory."""
    return None if memory is None else memory.to_state()


def _tensors(value):
    """The tensors in a saved state (nested lists, tuples and dicts), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def memory_batch_size(state) -> int | None:
    """The number of rows of a saved memory (`memory_state`, or an older checkpoint's form); None when it holds none."""
    first = next(_tensors(state), None)
    return None if first is None else first.shape[0]


def upgrade_memory_state(state, fresh) -> dict:
    """A saved memory in the form of `fresh.to_state()` (`fresh`: a new cache of the model that will read it). Reads
    the forms that checkpoints held before the caches' state protocol as well: a `MemoryCache`'s tuple (per-layer
    memories, key mask, tokens seen) and a `SpanCache`'s dict {"span_states", "seen_tokens"}; what those lack (the
    layer count, mem_len, memory_init, model_type) is `fresh`'s."""
    if isinstance(state, (tuple, list)) and len(state) == 3:
        memories, mask, seen_tokens = state
        return {
            **fresh.to_state(),
            "memory": torch.stack(list(memories), dim=1),
            "memory_mask": mask,
            "seen_tokens": seen_tokens,
        }
    if isinstance(state, dict) and set(state) == {"span_states", "seen_tokens"}:
        return {**fresh.to_state(), "states": list(state["span_states"]), "seen_tokens": state["seen_tokens"]}
    return state


def restore_memory(memory, state, source: str = "the checkpoint"):
    """The memory a checkpoint saved (`memory_state`, or an older checkpoint's form: `upgrade_memory_state`) as a
    cache, checked against `memory`, a fresh cache of the model that will read it; `memory` itself when nothing was
    saved."""
    if memory is None or state is None:
        return memory
    try:
        restored = type(memory).from_state(upgrade_memory_state(state, memory))
        fresh = memory.layers[0].keys if memory.layers else None  # (a fresh memory of zero vectors has its sizes)
        restored.check_compatible(
            batch_size=None if fresh is None else fresh.shape[0],
            hidden_size=None if fresh is None else fresh.shape[-1],
            num_layers=len(memory.layers),
            model_type=memory.model_type,
        )
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, RuntimeError) as error:
        raise ModelError(f"the memory saved in {source} does not fit this model: {error}") from None
    return restored


# The auxiliary terms of the variants' training objectives, by the names their outputs give them: the span penalty
# (adaptive span), the ponder cost (ACT: per position, its mean is the term) and Al-Rfou's intermediate-layer and
# future-target losses. Each enters `outputs.loss` with its config weight (adapt_span_loss, act_loss_weight,
# intermediate_loss_weight, future_target_loss_weight).
AUXILIARY_TERMS = ("span_penalty", "ponder_cost", "intermediate_loss", "future_loss")


@dataclass
class TrainingLosses:
    """One forward pass's training objective: `loss` is the model's own `outputs.loss` (what is optimised), `lm_loss`
    its next-token part and `terms` the auxiliary terms present in this pass (unweighted, by name)."""

    loss: torch.Tensor
    lm_loss: torch.Tensor
    terms: dict[str, torch.Tensor]

    def detached(self) -> dict[str, torch.Tensor]:
        """{"loss", "lm_loss", term names ...} -> detached scalars (for logging)."""
        return {
            "loss": self.loss.detach(),
            "lm_loss": self.lm_loss.detach(),
            **{name: value.detach() for name, value in self.terms.items()},
        }


def training_losses(output) -> TrainingLosses:
    """The objective of a causal-LM output computed with targets: `loss`, and the next-token part, which the outputs
    give as `lm_loss`, or (variants without auxiliary terms) as the loss itself."""
    from ..txv_act import mean_ponder_cost

    if output.get("loss") is None:
        raise ValueError("the model returned no loss: training needs the targets (shift_labels)")
    lm_loss = output.get("lm_loss")
    if lm_loss is None:
        lm_loss = output.loss
    terms = {}
    for name in AUXILIARY_TERMS:
        value = output.get(name)
        if value is not None:
            terms[name] = mean_ponder_cost(value) if name == "ponder_cost" else value
    return TrainingLosses(output.loss, lm_loss, terms)


def _check_targets(inputs: torch.Tensor, targets: torch.Tensor):
    if targets.shape != inputs.shape:
        raise ValueError(f"targets must have the shape of inputs {tuple(inputs.shape)}, got {tuple(targets.shape)}")


def objective_forward(model, inputs: torch.Tensor, targets: torch.Tensor, memory=None):
    """The model's training objective on `inputs` against `targets` (the inputs shifted by one across the segment
    boundary, given as `shift_labels`: position t predicts targets[t], so every token of the stream is predicted
    exactly once), as `outputs.loss` defines it: the next-token loss plus the variant's auxiliary terms. Returns
    (`TrainingLosses`, the updated memory). The logits are left out where the head allows it (an adaptive softmax then
    evaluates only the targets' clusters)."""
    _check_targets(inputs, targets)
    kwargs = {"cache": memory, "use_cache": True} if memory is not None else {"use_cache": False}
    if "return_logits" in getattr(unwrapped(model), "head_options", ()):
        kwargs["return_logits"] = False
    output = model(input_ids=inputs, shift_labels=targets, **kwargs)
    return training_losses(output), (output_cache(output) if memory is not None else None)


def after_optimizer_step(model):
    """What a variant's training does after each optimiser step: adaptive span clamps every learned span into
    [0, attn_span] (`clamp_spans_`, the original's `clamp_param`); other models are left alone."""
    model = unwrapped(model)
    for candidate in (model, getattr(model, "base_model", None)):
        if candidate is not None and hasattr(candidate, "clamp_spans_"):
            candidate.clamp_spans_()
            return


def set_training_progress(model, progress: float):
    """Tells a model whose objective follows a schedule (Al-Rfou's intermediate losses: `set_training_progress`) the
    fraction of training done, as `TrainingProgressCallback` does for Trainer; other models are left alone."""
    model = unwrapped(model)
    if hasattr(model, "set_training_progress"):
        model.set_training_progress(min(1.0, max(0.0, progress)))


def lm_forward(model, inputs: torch.Tensor, targets: torch.Tensor, memory=None, reduction: str = "mean"):
    """Next-token loss of `inputs` against `targets` (the inputs shifted by one across the segment boundary, so
    every token of the stream is predicted exactly once), and the updated memory.

    The loss is the plain next-token cross-entropy over every target (no auxiliary terms: what evaluation reports;
    training optimises `objective_forward`), `reduction` "mean" or "sum" over the targets.
    With an adaptive softmax it is the model's own per-target loss, the targets given as `shift_labels` (position t
    predicts targets[t]): only each target's cluster is evaluated and no `[tokens, vocabulary]` log-probabilities
    are made. Otherwise it is computed here from the logits. (Not with `labels`: their HF convention shifts inside
    the segment and would never predict a segment's last target.)"""
    kwargs = {"cache": memory, "use_cache": True} if memory is not None else {"use_cache": False}
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    _check_targets(inputs, targets)
    if getattr(unwrapped(model).config, "uses_adaptive_softmax", False):
        output = model(input_ids=inputs, shift_labels=targets, return_logits=False, **kwargs)
        # before auxiliary terms: the per-target losses (transfo-xl) or their mean `lm_loss` (GTrXL, adaptive span)
        losses = getattr(output, "losses", None)
        mean = losses.mean() if losses is not None else output.lm_loss
        loss = mean * targets.numel() if reduction == "sum" else mean
        return loss, (output_cache(output) if memory is not None else None)
    output = model(input_ids=inputs, **kwargs)
    logits = output.logits.to(at_least_float32(output.logits.dtype))  # float64 stays float64
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)
    return loss, (output_cache(output) if memory is not None else None)


def evaluation_memory(model, seg_len: int, eval_seg_len: int) -> int:
    """How many positions longer the memory of `model` is at validation with segments of `eval_seg_len` instead of
    `seg_len`: kimiyoung's train.py evaluates with `mem_len + tgt_len - eval_tgt_len`, so that every validation
    token sees as much context as a trained one at most; 0 for models without a Transformer-XL memory."""
    owner = _memory_owner(model)
    config = unwrapped(model).config
    # a Transformer-XL memory: its length is `config.mem_len` (the original adaptive-span model's cache has none)
    if eval_seg_len == seg_len or owner is None or getattr(config, "mem_len", None) is None:
        if eval_seg_len != seg_len and getattr(config, "mem_len", None) == 0:
            raise ModelError(
                f"--eval-seg-len {eval_seg_len} differs from --seg-len {seg_len}, but the model has no memory "
                "(mem_len 0): the original then gives it seg-len - eval-seg-len earlier tokens as extra input "
                "(its ext_len), which txv train does not do; give --eval-seg-len equal to --seg-len"
            )
        return 0
    extra = seg_len - eval_seg_len
    if config.mem_len + extra < 1:
        raise ModelError(
            f"--eval-seg-len {eval_seg_len} would leave a validation memory of {config.mem_len + extra} positions "
            f"(mem_len {config.mem_len} + seg-len {seg_len} - eval-seg-len {eval_seg_len})"
        )
    return extra


@contextlib.contextmanager
def lengthened_memory(model, extra: int):
    """Within the block, the memory of `model` keeps `extra` more positions (`evaluation_memory`)."""
    if not extra:
        yield
        return
    config = unwrapped(model).config
    config.mem_len += extra
    try:
        yield
    finally:
        config.mem_len -= extra


def leaves_parameters_unused(model) -> bool:
    """Whether a training step of `model` can leave some parameters out of the graph: an adaptive input or softmax
    evaluates a tail cluster only for the tokens in it (`txv_adaptive_softmax`), so a batch without them gives its
    parameters no gradient, as the original code does."""
    return bool(getattr(unwrapped(model).config, "cutoffs", None))


def load_config(path: str | Path):
    """The config of a saved model folder or Hub repo (`check_model_source` first), without its weights."""
    from transformers import AutoConfig

    import hf_txvariants  # noqa: F401  (registers the variants)

    check_model_source(path)
    try:
        return AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(f"could not read the config of {path}: {_first_line(error)}") from None
