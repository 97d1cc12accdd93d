"""Transformer-XL relative positional attention (Dai et al. 2019, section 3.3), shared by every XL-family variant.

For query position i and key position j the score is

    A_ij = (W_q x_i + u) . W_k x_j   +   (W_q x_i + v) . W_r R_{i-j}
           `------ content (a)+(c) --'    `------- position (b)+(d) ---'

with R the sinusoid table and u, v learned per-head biases (`r_w_bias`, `r_r_bias`). The content term is an ordinary
q.k product (u is folded into the query), so it goes through the shared attention functions (eager, SDPA); the
position term is computed for all relative distances and shifted into place, then passed as an additive mask. On
CPU the queries are attended in blocks, each over the keys it may see only (`query_blocks`).

With `attn_implementation="flex_attention"` (`flex_relative_attention`) no score matrix is built: the position term
`(q + v) . W_r R` is computed once per layer, by distance, and FlexAttention reads it inside its kernel at the index of
the relative shift (`kv - q + Q - 1`); the causal mask and any padding, window or episode are its block mask.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .txv_attention import additive_mask, get_attention_function
from .txv_dropout import Dropout
from .txv_flex import FLEX_MIN_HEAD_DIM, call_compiled
from .txv_positions import sinusoid_table
from .txv_precision import at_least_float32

FLEX_ATTENTION = "flex_attention"  # the `attn_implementation` of `flex_relative_attention`


def relative_distances(key_length: int, clamp_len: int, device) -> torch.Tensor:
    """Distances `key_length - 1, ..., 1, 0, -1` (clamped at `clamp_len` when it is > 0), the rows of the sinusoid
    table that `relative_shift` expects. The extra distance -1 only ever lands on future keys, which are masked; it
    makes the shifted view non-overlapping, so its backward pass is a plain strided copy."""
    distances = torch.arange(key_length - 1, -2, -1.0, device=device)
    return distances.clamp(max=clamp_len) if clamp_len > 0 else distances


def relative_position_embeddings(key_length: int, hidden_size: int, clamp_len: int, dtype, device) -> torch.Tensor:
    """`[key_length + 1, hidden_size]` sinusoids for `relative_distances` (Dai et al.'s R matrix)."""
    return sinusoid_table(relative_distances(key_length, clamp_len, device), hidden_size, dtype).to(dtype)


def relative_shift(position_scores: torch.Tensor, key_length: int) -> torch.Tensor:
    """Moves the position scores from "by distance" to "by key" layout without a copy (the paper's appendix B trick).

    `position_scores[..., i, m]` is the score of query i for distance `key_length - 1 - m` (the table of
    `relative_distances`: key_length - 1 down to 0, then one more row for -1; R = key_length + 1 rows). Query i sits
    at absolute position `M + i` (M = memory length, Q = query length, key_length = K = M + Q), so key j needs
    distance `M + i - j`, i.e. m = j + (Q - 1 - i): element `i * (R - 1) + j + (Q - 1) = (Q - 1) + i * K + j` of the
    row-major `[Q, R]` block. So the shifted scores are the flattened block from element Q - 1 on, read as `[Q, K]`:
    a slice and two views (no as_strided, so torch.compile traces and fuses it). Entries for future keys (j > M + i)
    read neighbouring values and must be masked by the caller. A table without the row for -1 (R = K) gets a zero
    column appended first (a copy)."""
    *batch, query_length, rows = position_scores.shape
    if rows not in (key_length, key_length + 1):
        raise ValueError(f"position scores have {rows} distances, expected {key_length} or {key_length + 1}")
    if rows == key_length:
        position_scores = nn.functional.pad(position_scores, (0, 1))
        rows += 1
    flat = position_scores.reshape(*batch, query_length * rows)
    shifted = flat[..., query_length - 1 : query_length - 1 + query_length * key_length]
    return shifted.view(*batch, query_length, key_length)


class RelativePositionAttention(nn.Module):
    """Multi-head attention over `[memory; hidden]` with Transformer-XL relative positions.

    Parameter names follow the original code (`qkv_net`, `r_net`, `o_net`, `r_w_bias`, `r_r_bias`) so that
    checkpoints of the original and of transformers' legacy TransfoXL load unchanged. When `own_biases` is False the
    u/v biases are shared across layers and passed to `forward` by the model."""

    def __init__(self, config, own_biases: bool = True):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        inner = self.num_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        # queries are attended in blocks of this many, each to the keys it may see (see `query_blocks`)
        self.query_block_size = 32
        self.qkv_net = nn.Linear(config.hidden_size, 3 * inner, bias=False)
        self.r_net = nn.Linear(config.hidden_size, inner, bias=False)
        self.o_net = nn.Linear(inner, config.hidden_size, bias=False)
        self.drop = Dropout(config.dropout)
        if own_biases:
            self.r_w_bias = nn.Parameter(torch.zeros(self.num_heads, self.head_dim))
            self.r_r_bias = nn.Parameter(torch.zeros(self.num_heads, self.head_dim))

    def key_value_weights_token(self, context_norm: nn.Module | None, hidden_states: torch.Tensor) -> tuple:
        """What the keys and values of a position depend on besides its memory vector: the projection (and the
        pre-norm) tensors, identified by storage and in-place version (an optimiser step or a reload changes it),
        and the autocast dtype."""
        tensors = [self.qkv_net.weight, *(context_norm.parameters() if context_norm is not None else ())]
        return weights_token(tensors, hidden_states.device.type)

    def position_keys(self, position_embeddings: torch.Tensor, key_values, hidden_states: torch.Tensor):
        """W_r R for the table's rows, scaled by 1 / sqrt(head_dim) (folded into the small position keys rather than
        applied to the [B, H, Q, R] scores): `[heads, rows, head_dim]`, shared by every row of the batch. In
        evaluation (`key_values` given) the projection of the cache's table is reused across passes."""

        def project(table: torch.Tensor) -> torch.Tensor:
            keys = self.r_net(table).view(table.shape[0], self.num_heads, self.head_dim) * self.scaling
            return keys.transpose(0, 1)

        if key_values is None or type(self.r_net) is not nn.Linear:  # a wrapped projection must be called
            return project(position_embeddings)
        token = weights_token([self.r_net.weight], hidden_states.device.type)
        return key_values.position_keys(token, position_embeddings, project)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: torch.Tensor,
        allowed: torch.Tensor,
        memory: torch.Tensor | None = None,
        context_norm: nn.Module | None = None,
        shared_biases: tuple[torch.Tensor, torch.Tensor] | None = None,
        output_attentions: bool = False,
        attention_bias: torch.Tensor | None = None,
        key_values=None,
        key_window: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        hidden_states: `[B, Q, hidden]` the current segment; memory: `[B, M, hidden]` or None.
        position_embeddings: `[M + Q + 1, hidden]` from `relative_position_embeddings` (dropped out); the
            `[M + Q, hidden]` table without the row for distance -1 is accepted too.
        allowed: bool, broadcastable to `[B, heads, Q, M + Q]`; causal: query i never sees a key after M + i.
        context_norm: applied to `[memory; hidden]` before the projections (pre-layer-norm models).
        attention_bias: an optional extra additive term, broadcastable to `[B, heads, Q, M + Q]` (e.g. the log of
            adaptive span's soft mask), added to the position scores.
        key_values: in evaluation, the layer's `txv_xl_reuse.KeyValueSlot`: the memory's keys and values are taken from
            it when they were cached with these weights (only the segment is projected), and this pass's are kept.
        key_window: when `allowed` lets a query see only the keys at distances 0 .. key_window - 1 (the
            same-length window, a hard span), its size: blocks of queries then skip the keys none of them sees.
        Returns the attention output after `o_net` and dropout, `[B, Q, hidden]`, and the weights if requested.
        """
        batch, query_length, _ = hidden_states.shape
        weights_token = cached = None
        if key_values is not None and type(self.qkv_net) is nn.Linear:
            weights_token = self.key_value_weights_token(context_norm, hidden_states)
            cached = key_values.lookup(weights_token, 0 if memory is None else memory.shape[1])
        query, key, value = self.project(hidden_states, None if cached is not None else memory, context_norm)
        if cached is not None:
            key, value = key_values.extend(cached, key, value)
        if weights_token is not None:
            key_values.keep(key, value, weights_token)
        position_keys = self.position_keys(position_embeddings, key_values, hidden_states)
        r_w_bias, r_r_bias = shared_biases if shared_biases is not None else (self.r_w_bias, self.r_r_bias)
        implementation = getattr(self.config, "_attn_implementation", None)
        if implementation == FLEX_ATTENTION and query_length > 1 and not output_attentions:
            output = flex_relative_attention(
                (query + r_w_bias).transpose(1, 2),
                key,
                value,
                # (b) + (d) by distance, [B, H, Q, rows]: the keys of the positions are scaled already
                torch.matmul((query + r_r_bias).transpose(1, 2), position_keys.transpose(-1, -2)),
                allowed,
                self.scaling,
                attention_bias,
                dropout=self.attention_dropout if self.training else 0.0,
            )
            return self.drop(self.o_net(output.reshape(batch, query_length, -1))), None
        attention = get_attention_function(self.config, output_attentions)
        if implementation == FLEX_ATTENTION and not output_attentions:  # one query (a step): no shift to fuse
            attention = ALL_ATTENTION_FUNCTIONS["sdpa"]
        # SDPA on CPU has no fused kernel with a bias gradient: see `biased_attention_with_bias_gradient`
        cpu_sdpa = attention is ALL_ATTENTION_FUNCTIONS.get("sdpa") and key.device.type == "cpu"
        if query_length == 1 and not output_attentions:
            output = self.attend_one_query(
                query, key, value, position_keys, allowed, attention_bias, r_w_bias, r_r_bias, attention, cpu_sdpa
            )
            return self.drop(self.o_net(output.reshape(batch, 1, -1))), None
        # [B, H, rows, head_dim] and the keys / values contiguous once per layer: every block then reads its rows and
        # keys as views (the batched products copy a strided or broadcast operand, once per block otherwise)
        position_keys = position_keys.expand(batch, -1, -1, -1).contiguous()
        key, value = key.contiguous(), value.contiguous()
        content_query = (query + r_w_bias).transpose(1, 2).contiguous()  # (a) + (c): u folded into the query
        position_query = (query + r_r_bias).transpose(1, 2).contiguous()  # (b) + (d)
        if attention_bias is None:  # one additive mask, sliced per block
            mask = additive_mask(allowed, query.dtype)
        key_length = key.shape[2]
        blocks = [(0, query_length, 0, key_length)]
        if not output_attentions and key.device.type == "cpu":
            # measured on CPU; on a GPU (not measured yet) one fused kernel call per layer is kept, and the weights
            # are returned whole
            blocks = query_blocks(query_length, key_length, key_window, self.query_block_size)
        outputs = []
        for first_query, end_query, first_key, end_key in blocks:
            queries, keys = slice(first_query, end_query), slice(first_key, end_key)
            # (b) + (d) of the block: (q + v) . W_r R for the block's distances (the last rows of the table, whose
            # key_length is end_key - first_key: the block is an XL attention of its own), then shifted (a view).
            # One product per (row, head): a row's scores do not depend on the batch it is in (bit for bit).
            block_keys = end_key - first_key
            rows = position_keys[:, :, key_length - block_keys :]
            position_scores = torch.matmul(position_query[:, :, queries], rows.transpose(2, 3))
            block_bias = relative_shift(position_scores, block_keys)
            if attention_bias is not None:
                block_bias = block_bias + block_of(attention_bias, queries, keys)
                block_bias = additive_mask(block_of(allowed, queries, keys), query.dtype, block_bias)
            else:  # one pass over the scores: the mask's finfo.min absorbs any finite score
                block_bias = block_bias + block_of(mask, queries, keys)
            block_attention = (
                biased_attention_with_bias_gradient if cpu_sdpa and block_bias.requires_grad else attention
            )
            output, weights = block_attention(
                self,
                content_query[:, :, queries],
                key[:, :, keys],
                value[:, :, keys],
                block_bias,
                scaling=self.scaling,
                dropout=self.attention_dropout if self.training else 0.0,
            )
            outputs.append(output)
        output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        output = self.drop(self.o_net(output.reshape(batch, query_length, -1)))
        return output, weights

    def attend_one_query(
        self, query, key, value, position_keys, allowed, attention_bias, r_w_bias, r_r_bias, attention, cpu_sdpa
    ) -> torch.Tensor:
        """The attention of one query per row (a step of `generate()`, an agent acting), `[B, 1, heads, head_dim]`.
        The query sits at position K - 1 and sees key j at distance K - 1 - j, which is row j of the table (whose
        rows run from distance K - 1 down): the position scores are the first K columns of (q + v) . W_r R, with no
        shift, and the position keys, shared by the batch, meet all the rows' queries in one product per head."""
        batch, _, heads, head_dim = query.shape
        key_length = key.shape[2]
        position_query = (query[:, 0] + r_r_bias).transpose(0, 1)  # [H, B, head_dim]
        position_scores = torch.bmm(position_query, position_keys[:, :key_length].transpose(1, 2))  # [H, B, K]
        bias = position_scores.transpose(0, 1)[:, :, None]  # [B, H, 1, K]
        if attention_bias is not None:
            bias = bias + attention_bias
        bias = additive_mask(allowed, query.dtype, bias)
        content_query = (query + r_w_bias).transpose(1, 2)  # (a) + (c): u folded into the query
        dropout = self.attention_dropout if self.training else 0.0
        if cpu_sdpa and bias.requires_grad:
            return biased_attention_with_bias_gradient(self, content_query, key, value, bias, self.scaling, dropout)[0]
        if attention is ALL_ATTENTION_FUNCTIONS.get("sdpa"):  # torch's kernel itself: the wrapper's checks cost a step
            output = nn.functional.scaled_dot_product_attention(
                content_query, key, value, attn_mask=bias, dropout_p=dropout, scale=self.scaling
            )
            return output.transpose(1, 2)
        return attention(self, content_query, key, value, bias, scaling=self.scaling, dropout=dropout)[0]

    def project(self, hidden_states: torch.Tensor, memory: torch.Tensor | None, context_norm: nn.Module | None):
        """query `[B, Q, heads, head_dim]` for the segment, key and value `[B, heads, M + Q, head_dim]` for
        `[memory; segment]` (M = 0 without memory).

        The segment goes through the whole fused weight, the memory through its key and value blocks only: the memory
        is detached, so (without a pre-norm, whose parameters see the memory rows) backward computes only the weight
        gradient of the memory rows, not an input gradient that nothing uses."""
        batch, query_length, _ = hidden_states.shape
        heads = (self.num_heads, self.head_dim)
        memory_length = 0 if memory is None else memory.shape[1]
        inner = self.num_heads * self.head_dim
        if type(self.qkv_net) is not nn.Linear:  # a wrapped projection (e.g. a PEFT LoRA layer) must be called
            context = hidden_states if memory is None else torch.cat([memory, hidden_states], dim=1)
            if context_norm is not None:
                context = context_norm(context)
            query, key, value = self.qkv_net(context).chunk(3, dim=-1)
            query = query[:, memory_length:]
        else:
            if context_norm is not None:  # one norm over [memory; segment], split again
                context = hidden_states if memory is None else torch.cat([memory, hidden_states], dim=1)
                memory, hidden_states = context_norm(context).split([memory_length, query_length], dim=1)
            query, key, value = nn.functional.linear(hidden_states, self.qkv_net.weight).chunk(3, dim=-1)
            if memory_length > 0:
                memory_key, memory_value = nn.functional.linear(memory, self.qkv_net.weight[inner:]).chunk(2, dim=-1)
                key, value = torch.cat([memory_key, key], dim=1), torch.cat([memory_value, value], dim=1)
        key_length = memory_length + query_length
        key = key.reshape(batch, key_length, *heads).transpose(1, 2)
        value = value.reshape(batch, key_length, *heads).transpose(1, 2)
        return query.reshape(batch, query_length, *heads), key, value


# the block mask of the last `allowed` tensor: every layer of a pass gets the same one (kept while it is alive)
_LAST_BLOCK_MASK: list = []


def relative_block_mask(allowed: torch.Tensor):
    """FlexAttention's `BlockMask` of `allowed` (bool, `[B or 1, 1, Q, K]`): blocks of keys no query of a block sees
    are skipped. Built once per `allowed` tensor (the layers of a pass share it); always outside a compiled graph
    (`flex_relative_attention` leaves it)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if _LAST_BLOCK_MASK and _LAST_BLOCK_MASK[0] is allowed:
        return _LAST_BLOCK_MASK[1]
    batch, mask_heads, query_length, key_length = allowed.shape
    if mask_heads != 1:
        raise ValueError(f"allowed must be [batch or 1, 1, Q, K] for FlexAttention, got {tuple(allowed.shape)}")
    if batch == 1:

        def mask_mod(b, h, q_idx, kv_idx):
            return allowed[0, 0, q_idx, kv_idx]

    else:

        def mask_mod(b, h, q_idx, kv_idx):
            return allowed[b, 0, q_idx, kv_idx]

    block_mask = create_block_mask(
        mask_mod, batch if batch > 1 else None, None, query_length, key_length, device=allowed.device
    )
    _LAST_BLOCK_MASK[:] = [allowed, block_mask]
    return block_mask


def flex_relative_attention(
    content_query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    position_scores: torch.Tensor,
    allowed: torch.Tensor,
    scaling: float,
    attention_bias: torch.Tensor | None = None,
    dropout: float = 0.0,
    compile: bool | None = None,
) -> torch.Tensor:
    """Transformer-XL's relative attention through FlexAttention, without a `[B, H, Q, K]` score matrix.

    content_query `[B, H, Q, D]` (q + u), key / value `[B, H, K, D]` over `[memory; segment]`, position_scores
    `[B, H, Q, rows]` the scaled position term by distance (rows = K + 1, or K: `relative_shift`'s layout: column m
    is distance K - 1 - m), allowed the bool `[B or 1, 1, Q, K]` keys each query sees (causal: none after M + i),
    attention_bias an optional additive `[.., H or 1, Q, K]` term (adaptive span's log mask).

    The score of query i and key j is `scaling q_i . k_j + position_scores[i, j + Q - 1 - i]` (the relative shift as
    an index: query i sits at M + i, key j at distance M + i - j); the index is clamped for the future keys, which
    the block mask removes. `compile` (default: on CUDA) calls a compiled FlexAttention, else torch runs its unfused
    reference (which does build the scores). Inside a compiled model the call is left out of the model's graph (a
    graph break per layer, see `_flex_relative_attention_outside_the_graph`) and compiled on its own (any device).
    Returns `[B, Q, H, D]`. torch 2.13 has no FlexAttention backward on CPU (a ValueError names the choice that
    trains there)."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():
        # a model being compiled asks for compiled kernels: FlexAttention compiled on its own, on every device
        return _flex_relative_attention_outside_the_graph(
            content_query, key, value, position_scores, allowed, scaling, attention_bias, dropout, compile is not False
        )
    if dropout > 0:
        raise ValueError(
            f"attn_implementation='flex_attention' has no attention dropout (attention_dropout {dropout} in "
            "training): set attention_dropout to 0 or use attn_implementation='sdpa'"
        )
    batch, heads, query_length, head_dim = content_query.shape
    last_row = position_scores.shape[-1] - 1
    offset = query_length - 1
    if attention_bias is not None:
        attention_bias = attention_bias.expand(batch, heads, query_length, key.shape[2])

    def score_mod(score, b, h, q_idx, kv_idx):
        score = score + position_scores[b, h, q_idx, torch.clamp(kv_idx - q_idx + offset, max=last_row)]
        return score if attention_bias is None else score + attention_bias[b, h, q_idx, kv_idx]

    block_mask = relative_block_mask(allowed)
    if head_dim < FLEX_MIN_HEAD_DIM:  # zero columns: the same products
        pad = (0, FLEX_MIN_HEAD_DIM - head_dim)
        content_query, key, value = (nn.functional.pad(t, pad) for t in (content_query, key, value))
    compiled = compile if compile is not None else content_query.device.type == "cuda"
    arguments = dict(score_mod=score_mod, block_mask=block_mask, scale=scaling)
    try:
        if not compiled:  # (a model being compiled returned above)
            output = flex_attention(content_query, key, value, **arguments)
        else:
            output = call_compiled(flex_attention, content_query, key, value, **arguments)
    except NotImplementedError as error:  # torch's own refusal, said with the choice that trains there
        if "backward on CPU" not in str(error):
            raise
        raise ValueError(
            "FlexAttention has no backward on CPU in torch 2.13: train on CPU with attn_implementation='sdpa' "
            "(or 'eager'); attn_implementation='flex_attention' serves inference there"
        ) from None
    return output[..., :head_dim].transpose(1, 2)


# torch 2.13's TorchDynamo drops every attribute assignment made after a flex_attention call to an object already
# assigned to before it in the same compiled frame (measured: `box.n += 1; flex_attention(q, q, q); box.m += 1` under
# torch.compile(fullgraph=True) leaves box.m unchanged, with no error). A model's memory is such an object: compiled
# with flex_attention in its graph, the memory silently stopped updating. So a compiled model calls FlexAttention
# outside its graph, compiled on its own (`compile`), at the cost of a graph break per layer.
_flex_relative_attention_outside_the_graph = torch.compiler.disable(
    flex_relative_attention, reason="TorchDynamo drops the memory's updates after a flex_attention call (torch 2.13)"
)


def weights_token(tensors, device_type: str) -> tuple:
    """Names the values of `tensors` for a cache: storage, in-place version (an optimiser step or a reload changes
    it) and dtype of each, and the autocast dtype of `device_type` (None without autocast)."""
    autocast = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    return (autocast, *((t.data_ptr(), t._version, t.dtype) for t in tensors))


# a block's first key is rounded down to a multiple of this (a few more masked keys): the attention kernels are
# markedly slower on odd key counts (the fused CPU kernel: 9.9 ms for 255 keys against 6.5 ms for 256)
KEY_ALIGNMENT = 32


def biased_attention_with_bias_gradient(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """softmax(mask + scaling q k^T) v where the additive mask (the position scores) needs a gradient: on CPU no fused
    SDPA kernel gives one, so SDPA runs its math fallback, which also checks every row for -inf (three more passes
    over the scores). The same maths with the product accumulated into the mask in place (`baddbmm_`; the mask is
    this block's own sum, which autograd does not keep). Returns `[B, Q, heads, head_dim]` as the attention
    functions do."""
    batch, heads, query_length, head_dim = query.shape
    key_length = key.shape[2]
    # an in-place product is not cast by autocast, and the operands may differ (under autocast the query is float32
    # after adding the float32 u bias, the keys are the autocast dtype): all in the dtype autocast gives a baddbmm
    compute_dtype = product_dtype(query, key)
    query, key, value = query.to(compute_dtype), key.to(compute_dtype), value.to(compute_dtype)
    if attention_mask.dtype != compute_dtype:  # float32's finfo.min would become -inf in float16: clamp first
        attention_mask = attention_mask.clamp(min=torch.finfo(compute_dtype).min).to(compute_dtype)
    scores = attention_mask.expand(batch, heads, query_length, key_length)
    if not scores.is_contiguous():  # broadcast or strided: a copy (contiguous: the block's own sum, used in place)
        scores = scores.contiguous()
    flat = (batch * heads, query_length, key_length)
    scores = scores.view(flat).baddbmm_(
        query.reshape(-1, query_length, head_dim), key.reshape(-1, key_length, head_dim).transpose(1, 2), alpha=scaling
    )
    scores = scores.view(batch, heads, query_length, key_length)
    weights = nn.functional.softmax(scores, dim=-1, dtype=at_least_float32(scores.dtype))
    weights = nn.functional.dropout(weights.to(query.dtype), p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2), None


def product_dtype(*operands: torch.Tensor) -> torch.dtype:
    """The dtype of a matrix product of `operands` as the caller would get it from an out-of-place op: the autocast
    dtype when autocast is on for their device (a float product is cast to it), else their promoted dtype."""
    device_type = operands[0].device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    dtype = operands[0].dtype
    for operand in operands[1:]:
        dtype = torch.promote_types(dtype, operand.dtype)
    return dtype


def query_blocks(query_length: int, key_length: int, key_window: int | None, block_size: int) -> list[tuple]:
    """`(first query, end query, first key, end key)` of each block of `block_size` queries and of the keys the block
    may see: query i sits at position M + i (M = key_length - query_length) and sees no key after M + i, nor, with a
    `key_window`, before M + i - key_window + 1. The keys outside a block's range are masked for all its queries, so
    attending to the range only gives the same softmax over fewer scores (with M = Q = 128 and blocks of 32: 5/8 of
    the score work under the same-length window of M keys, 13/16 causally)."""
    memory_length = key_length - query_length
    blocks = []
    for first_query in range(0, query_length, block_size):
        end_query = min(first_query + block_size, query_length)
        first_key = 0 if key_window is None else max(0, memory_length + first_query - key_window + 1)
        first_key -= first_key % KEY_ALIGNMENT
        blocks.append((first_query, end_query, first_key, memory_length + end_query))
    return blocks


def block_of(scores: torch.Tensor, queries: slice, keys: slice) -> torch.Tensor:
    """The `[..., queries, keys]` block of a tensor broadcastable to `[..., Q, K]` (a broadcast dimension is kept)."""
    if scores.shape[-2] != 1:
        scores = scores[..., queries, :]
    return scores if scores.shape[-1] == 1 else scores[..., keys]
