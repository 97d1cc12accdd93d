"""The adaptive softmax as a language-model head option of the XL family (Transformer-XL's `crit`; Gated
Transformer-XL and Adaptive Span with `adaptive=True`), with the config fields of `TransfoXLConfig`: `adaptive`,
`cutoffs`, `div_val`, `d_embed`, `tie_projs`. The loss is `txv_losses.causal_lm_loss`'s (same shift, ignore_index,
denominator, 0.0 when every target is ignored) with the adaptive softmax's NLL in place of a cross-entropy over
logits; the logits are log-probabilities (the adaptive softmax is normalised)."""

from __future__ import annotations

import torch

from .txv_config_checks import integer_list
from .txv_losses import check_causal_lm_targets


def adaptive_softmax_defaults(config, proj_share_all_but_first: bool = True):
    """`cutoffs` as a list of ints, `d_embed` = hidden_size and `tie_projs` (the first cluster's projection untied,
    the others tied when `proj_share_all_but_first`) where not given."""
    config.cutoffs = integer_list(config, "cutoffs")
    if config.d_embed is None:
        config.d_embed = config.hidden_size
    if config.tie_projs is None:
        config.tie_projs = [False] + [bool(proj_share_all_but_first)] * len(config.cutoffs)


def check_adaptive_softmax_fields(config):
    """A ValueError naming the field when the adaptive embedding / softmax fields do not fit the vocabulary."""
    if config.d_embed <= 0:
        raise ValueError(f"d_embed must be > 0, got {config.d_embed}")
    if config.div_val < 1:
        raise ValueError(f"div_val must be >= 1, got {config.div_val}")
    if list(config.cutoffs) != sorted(set(config.cutoffs)) or any(c <= 0 for c in config.cutoffs):
        raise ValueError(f"cutoffs must be strictly increasing positive integers, got {config.cutoffs}")
    if config.cutoffs and config.cutoffs[-1] >= config.vocab_size:
        raise ValueError(f"cutoffs must be below vocab_size ({config.vocab_size}), got {config.cutoffs}")
    if config.d_embed // (config.div_val ** len(config.cutoffs)) < 1:
        raise ValueError(
            f"d_embed ({config.d_embed}) is too small for div_val={config.div_val} with {len(config.cutoffs)} "
            "cutoffs: the last cluster would have no embedding dimension"
        )
    if len(config.tie_projs) != len(config.cutoffs) + 1:
        raise ValueError(f"tie_projs needs one entry per cluster ({len(config.cutoffs) + 1}), got {config.tie_projs}")


def adaptive_tied_weights_keys(config, embedding_path: str, softmax_path: str = "crit") -> dict[str, str]:
    """The legacy tying rules: the softmax clusters' weights tied to the input embeddings' (`tie_word_embeddings`),
    and per cluster the softmax projection to the embedding projection (`tie_projs`)."""
    tied = {}
    if config.tie_word_embeddings:
        for i in range(len(config.cutoffs) + 1 if config.div_val != 1 else 1):
            tied[f"{softmax_path}.out_layers.{i}.weight"] = f"{embedding_path}.emb_layers.{i}.weight"
    for i, tie in enumerate(config.tie_projs):
        if tie and config.div_val == 1 and config.hidden_size != config.d_embed:
            tied[f"{softmax_path}.out_projs.{i}"] = f"{embedding_path}.emb_projs.0"
        elif tie and config.div_val != 1:
            tied[f"{softmax_path}.out_projs.{i}"] = f"{embedding_path}.emb_projs.{i}"
    return tied


def adaptive_lm_outputs(
    crit, hidden_states: torch.Tensor, vocab_size: int, labels=None, logits_to_keep: int = 0,
    num_items_in_batch=None, shift_labels=None, return_logits: bool = True,
):
    """`(logits, losses, loss)`: log-probabilities of the last `logits_to_keep` positions (0: all; None without
    `return_logits`), the per-token NLLs `[batch, length - 1]` (`[batch, length]` with `shift_labels`; 0 where the
    target is -100) and their mean; both None without targets."""
    losses = loss = logits = None
    if labels is not None or shift_labels is not None:
        check_causal_lm_targets(labels, shift_labels, hidden_states.shape[:2], vocab_size)
        if shift_labels is not None:
            predicting, targets = hidden_states, shift_labels.to(hidden_states.device)
        else:
            predicting, targets = hidden_states[:, :-1], labels[:, 1:].to(hidden_states.device)
        losses = crit.nll(predicting.reshape(-1, hidden_states.shape[-1]), targets.reshape(-1)).view(targets.shape)
        denominator = num_items_in_batch if num_items_in_batch is not None else (targets != -100).sum().clamp(min=1)
        loss = losses.sum() / denominator
    if return_logits:
        logits = crit.log_probs(hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states)
    return logits, losses, loss


__all__ = [
    "adaptive_lm_outputs",
    "adaptive_softmax_defaults",
    "adaptive_tied_weights_keys",
    "check_adaptive_softmax_fields",
]
