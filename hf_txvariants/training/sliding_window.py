"""Al-Rfou et al.'s (2019) sliding-window evaluation of a causal language model (evaluation code, not model code)."""

from __future__ import annotations

import torch


@torch.no_grad()
def sliding_window_log_probs(model, input_ids: torch.LongTensor, window: int, windows_per_batch: int = 1):
    """Al-Rfou et al.'s evaluation: `[batch, length - 1]` log-probabilities of input_ids[:, t] for t >= 1.

    `window` is the model's input length. The first `window` tokens are scored in one pass (token t sees the t
    tokens before it); after that the window moves by one token and is recomputed from scratch, so every token
    t >= window sees exactly the `window` tokens before it, at the cost of a full forward pass per token.
    `windows_per_batch` stacks that many shifted windows into one forward pass (same arithmetic, fewer Python calls).
    `model` is any causal LM returning `logits`."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    if windows_per_batch < 1:
        raise ValueError(f"windows_per_batch must be >= 1, got {windows_per_batch}")
    batch, length = input_ids.shape

    def log_probs_of(chunk):
        logits = model(input_ids=chunk, use_cache=False).logits
        return torch.log_softmax(logits.float(), dim=-1)

    first = input_ids[:, : min(window, length)]
    scores = [log_probs_of(first)[:, :-1].gather(-1, first[:, 1:, None])[..., 0]]
    targets = list(range(window, length))
    for start in range(0, len(targets), windows_per_batch):
        group = targets[start : start + windows_per_batch]
        chunk = torch.cat([input_ids[:, t - window : t] for t in group], dim=0)  # the `window` tokens before t
        last = log_probs_of(chunk)[:, -1].view(len(group), batch, -1)
        wanted = torch.stack([input_ids[:, t] for t in group])  # [group, batch]
        scores.append(last.gather(-1, wanted[..., None])[..., 0].t())
    return torch.cat(scores, dim=1)


__all__ = ["sliding_window_log_probs"]
