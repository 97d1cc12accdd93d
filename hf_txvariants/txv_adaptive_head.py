"""The adaptive softmax as a language-model head option of the XL family (Transformer-XL's `crit`; Gated
Transformer-XL and Adaptive Span with `adaptive=True`), with the config fields of `TransfoXLConfig`: `adaptive`,
`cutoffs`, `div_val`, `d_embed`, `tie_projs`. The loss is `txv_losses.causal_lm_loss`'s (same shift, ignore_index,
denominator, 0.0 when every target is ignored) with the adaptive softmax's NLL in place of a cross-entropy over
logits; the logits are log-probabilities (the adaptive softmax is normalised)."""

from __future__ import annotations

import torch

from .txv_losses import causal_lm_head, check_causal_lm_targets


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
    crit,
    hidden_states: torch.Tensor,
    vocab_size: int,
    labels=None,
    logits_to_keep: int = 0,
    num_items_in_batch=None,
    shift_labels=None,
    return_logits: bool = True,
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


def xl_lm_head(
    head,
    hidden_states: torch.Tensor,
    config,
    labels=None,
    logits_to_keep: int = 0,
    return_logits: bool = True,
    num_items_in_batch=None,
    shift_labels=None,
):
    """`(logits, losses, loss)` of an XL-family LM head: `head` is the adaptive softmax (`crit`) when
    `config.uses_adaptive_softmax` (see `adaptive_lm_outputs`), else the linear `lm_head` (`txv_losses.causal_lm_head`,
    its logits made for the loss anyway, then left out without `return_logits`; no per-token `losses`)."""
    if not config.uses_adaptive_softmax:
        logits, loss = causal_lm_head(
            head,
            hidden_states,
            config.vocab_size,
            labels,
            logits_to_keep,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
        )
        return (logits if return_logits else None), None, loss
    return adaptive_lm_outputs(
        head,
        hidden_states,
        config.vocab_size,
        labels,
        logits_to_keep,
        num_items_in_batch=num_items_in_batch,
        shift_labels=shift_labels,
        return_logits=return_logits,
    )


__all__ = [
    "adaptive_lm_outputs",
    "adaptive_tied_weights_keys",
    "xl_lm_head",
]
