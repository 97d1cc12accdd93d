"""A pattern (`txv_patterns`) through FlexAttention: its `BlockMask`, built once per (pattern, lengths, device) and
cached (fused kernels on CUDA; on CPU torch 2.13 runs FlexAttention in inference only, without gradients). Masks of
more than `COMPILED_MASK_ENTRIES` entries are built by a compiled kernel, block by block.
"""

from __future__ import annotations

import torch
from torch import nn

from .txv_flex import FLEX_MIN_HEAD_DIM, call_compiled
from .txv_patterns import PatternCache

_BLOCK_MASKS = PatternCache(16)


# Above this many mask entries (heads x q_len x k_len) a CUDA block mask is built by a compiled kernel, block by
# block: eager `create_block_mask` evaluates the pattern on the whole [heads, q_len, k_len] grid, with int64
# intermediates. Measured on an H100 at 64k (4 layers, 8 heads): the strided merged, strided per-head and fixed
# per-head patterns ran out of its 80 GB building their masks eagerly.
COMPILED_MASK_ENTRIES = 2**28


def compiles_mask(device, heads: int | None, q_len: int, k_len: int) -> bool:
    """Whether `flex_block_mask` builds this mask with a compiled kernel by default (CUDA, long masks)."""
    return torch.device(device).type == "cuda" and (heads or 1) * q_len * k_len > COMPILED_MASK_ENTRIES


def flex_block_mask(pattern, num_heads, q_len, k_len, device, q_offset=0, block_size=128, compile_mask=None):
    """The pattern's FlexAttention `BlockMask`, built once per (pattern, heads, lengths, offset, device) and kept in a
    small LRU cache (padding is applied as a score modification, so it does not enter the mask). `compile_mask`:
    build it with a compiled kernel (default: on CUDA above `COMPILED_MASK_ENTRIES`), else eagerly."""
    from torch.nn.attention.flex_attention import create_block_mask

    heads = num_heads if pattern.per_head else None
    if compile_mask is None:
        compile_mask = compiles_mask(device, heads, q_len, k_len)

    def build():
        def mask_mod(b, h, q_idx, kv_idx):
            return pattern.allowed(q_idx + q_offset, kv_idx, h)

        arguments = (mask_mod, None, heads, q_len, k_len)
        if compile_mask:
            return call_compiled(create_block_mask, *arguments, device=device, BLOCK_SIZE=block_size)
        return create_block_mask(*arguments, device=device, BLOCK_SIZE=block_size)

    key = (pattern, heads, q_len, k_len, q_offset, str(device), block_size, compile_mask)
    return _BLOCK_MASKS.get_or_build(key, build)


def flex_pattern_attention(query, key, value, pattern, scaling, key_padding_mask=None, q_offset=0, compile=None):
    """FlexAttention with the pattern's cached block mask. Returns `[batch, q_len, heads, head_dim]`."""
    from torch.nn.attention.flex_attention import flex_attention

    if query.device.type == "cpu" and torch.is_grad_enabled() and (query.requires_grad or key.requires_grad):
        raise ValueError(
            "FlexAttention has no backward on CPU in torch 2.13: use pattern_implementation='blocked' to train on CPU"
        )
    heads, q_len, head_dim = query.shape[1:]
    block_mask = flex_block_mask(pattern, heads, q_len, key.shape[2], query.device, q_offset)
    if head_dim < FLEX_MIN_HEAD_DIM:
        query, key, value = (nn.functional.pad(t, (0, FLEX_MIN_HEAD_DIM - head_dim)) for t in (query, key, value))
    score_mod = None
    if key_padding_mask is not None:
        minimum = torch.finfo(query.dtype).min  # not -inf: a row with only padded keys stays finite

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(key_padding_mask[b, kv_idx], score, minimum)

    compiled = compile if compile is not None else query.device.type == "cuda"
    if not compiled or torch.compiler.is_compiling():  # inside a compiled model the model's graph holds the kernel
        output = flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling)
    else:
        output = call_compiled(
            flex_attention, query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling
        )
    return output[..., :head_dim].transpose(1, 2).contiguous()
