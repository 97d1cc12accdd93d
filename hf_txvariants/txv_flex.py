"""What every FlexAttention caller here shares (the structured patterns of `txv_pattern_flex` and Transformer-XL's
relative attention, `txv_relative_attention`): the smallest head size its kernels take, and its compiled calls, made
once and run under a recompile limit of their own."""

from __future__ import annotations

import torch

FLEX_MIN_HEAD_DIM = 16  # FlexAttention's kernels need head_dim >= 16: smaller heads are zero-padded (exact)


# torch.compile keeps a few kernels per function (torch._dynamo.config.recompile_limit, 8) and past that runs the
# function eagerly: flex_attention unfused, materialising every score (measured on an H100 at 16k, 4 layers, the fixed
# merged pattern: a forward of 305 ms and 26.8 GB against 9 ms and 0.26 GB fused), and a block mask built on the whole
# grid. Each pattern, grad mode and length is a kernel of its own, so a process with a few patterns (a benchmark, a
# sweep, evaluation at another length) passes 8 quickly: the compiled calls here run under this limit.
FLEX_RECOMPILE_LIMIT = 64
_COMPILED: dict = {}  # function -> its torch.compile'd form, made on first use


def call_compiled(function, *args, **kwargs):
    """`function(*args, **kwargs)` through torch.compile (made once, static shapes), under FLEX_RECOMPILE_LIMIT."""
    if function not in _COMPILED:
        _COMPILED[function] = torch.compile(function, dynamic=False)
    limit = max(torch._dynamo.config.recompile_limit, FLEX_RECOMPILE_LIMIT)
    with torch._dynamo.config.patch(recompile_limit=limit):
        return _COMPILED[function](*args, **kwargs)


__all__ = ["FLEX_MIN_HEAD_DIM", "FLEX_RECOMPILE_LIMIT", "call_compiled"]
