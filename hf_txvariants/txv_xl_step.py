"""One step of an XL-family stack over a sliding memory window: an agent acting in many environments at once, one new
position per row and call, each layer attending to its last `mem_len` memory slots and the new position.

`XLBackboneMixin.run_backbone` gives the same outputs for any segment length, padding and mechanism. For one position
per row that generality is most of the cost: about 310 aten ops, 60 module calls and the cache's bookkeeping per step
of the RL benchmark's 2-layer GTrXL in 16 environments, where each small kernel takes ~3 us on a CPU
(benchmarks/RESULTS.md, "Acting speed"). Here that step is 110 aten ops, on state kept in the form a step needs:

- `StepWeights`: made once per version of the weights (`token`, kept by the caller). Every matrix transposed for
  `torch.addmm`; 1 / sqrt(head_dim) folded into W_q and u; the position term (q + v) . W_r R_(K-1-j), linear in the
  layer's normed input, as a product with W_q (W_r R)_h per head and the bias v . (W_r R)_h (key slot j of the window
  always sits at distance K - 1 - j from the new position, so these are constants). The query, the position term,
  the key and the value come from one product, its columns grouped by head so that each part is a view with one
  stride per (row, head), as the batched products need. A GRU gate's stacked matrices (`GRUGate.stacked_weights`,
  for `GRUGate.fused`, the gate's own maths).
- `StepMemory`: per layer the memory vectors (the inputs the layer saw, what `MemoryCache` holds) and their keys and
  values, `[rows, heads, 2, head_dim, slots]`, in buffers with room for `mem_len` more slots. The window is a view; a
  step writes one slot per buffer and moves the view by one, and every `mem_len` steps the window is copied back to
  the front (as `txv_cache.AppendBuffers` does for the general path). `blocked [rows, slots]`, one for all layers,
  marks the slots a row may not attend: empty ones, and those before its episode's start.

The keys and values of the memory belong to the weights that made them: after an optimiser step they are made again
from the memory vectors, as the general path does. Against the general path the maths is the same with the float
operations in another order: equal within float32 rounding (`tests/test_xl_step.py`). `step_support` says why a model
cannot step here (the caller then runs the general path): adaptive span, wrapped (e.g. PEFT) or other non-plain parts,
shared u / v biases, a window shorter than the memory plus one.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .txv_cache import MemoryCache
from .txv_feedforward import PositionwiseFeedForward
from .txv_gates import GatingLayer, GRUGate
from .txv_relative_attention import RelativePositionAttention, relative_position_embeddings
from .txv_xl import attention_window


def step_support(model) -> str | None:
    """None if `model` (an XL-family base model, e.g. `GTrXLModel`) can step here, else why not (in words)."""
    config = model.config
    if config.mem_len <= 0:
        return "mem_len is 0 (no memory to slide)"
    if getattr(config, "adapt_span_enabled", False):
        return "adaptive span (its spans cut the keys per layer)"
    window = attention_window(config)
    if window is not None and window < config.mem_len + 1:
        return f"the attention window ({window} keys) is shorter than mem_len + 1"
    for index, layer in enumerate(model.layers):
        attention = layer.part("attention")
        if type(attention) is not RelativePositionAttention or not hasattr(attention, "r_w_bias"):
            return f"layer {index}'s attention is not a RelativePositionAttention with its own u / v biases"
        plain = (attention.qkv_net, attention.r_net, attention.o_net)
        if any(type(module) is not nn.Linear for module in plain):
            return f"layer {index}'s attention projections are wrapped (not plain nn.Linear)"
        norms = (layer.part("attention_norm"), layer.part("feed_forward_norm"))
        if any(type(norm) is not nn.LayerNorm for norm in norms):
            return f"layer {index}'s norms are not plain nn.LayerNorm"
        feed_forward = layer.part("feed_forward")
        if type(feed_forward) is not PositionwiseFeedForward or any(
            type(feed_forward.CoreNet[i]) is not nn.Linear for i in (0, 3)
        ):
            return f"layer {index}'s feed-forward is not a plain PositionwiseFeedForward"
        if layer.residual == "reordered":
            for gate in (layer.attention_gate, layer.feed_forward_gate):
                if not isinstance(gate, GatingLayer) or any(
                    type(getattr(gate, name)) is not nn.Linear for name in gate.matrices
                ):
                    return f"layer {index}'s gates are wrapped"
    return None


def _layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return torch.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)  # (F's checks cost a step)


class LayerStepWeights:
    """One layer's weights in the form a step uses (see the module's docstring); matrices transposed for
    `torch.mm` / `torch.addmm`."""

    def __init__(self, layer, key_count: int, position_table: torch.Tensor):
        attention = layer.part("attention")
        self.residual = layer.residual
        self.heads, self.head_dim = attention.num_heads, attention.head_dim
        heads, head_dim = self.heads, self.head_dim
        inner = heads * head_dim
        scale = attention.scaling
        qkv = attention.qkv_net.weight
        query_weight = qkv[:inner].t() * scale  # [hidden, inner]
        self.key_value_weight = qkv[inner:].t().contiguous()  # [hidden, keys then values]
        # The position term (q + v) . W_r R_(K-1-j) is linear in the context: one product with W_q (W_r R)_h per
        # head h, whose columns are the key slots, and the bias v . (W_r R)_h. Key slot j of the window sits at
        # distance K - 1 - j: row j of the table.
        positions = F.linear(position_table[:key_count], attention.r_net.weight)  # [K, inner]
        position_keys = positions.view(key_count, heads, head_dim).permute(1, 2, 0)  # [heads, d, K]
        by_head = query_weight.view(-1, heads, 1, head_dim)
        position_weight = (by_head @ position_keys).squeeze(2)  # [hidden, heads, K]
        position_bias = (attention.r_r_bias * scale)[:, None] @ position_keys  # [heads, 1, K]
        # One product gives a step everything its attention needs, grouped by head so that each part is a view with
        # one stride per (row, head): [query + u, position term + its bias, key, value], 3 d + K columns a head.
        key_value = self.key_value_weight.view(-1, 2, heads, head_dim).transpose(1, 2).flatten(2)  # [hidden, heads, 2d]
        self.projection_weight = torch.cat([by_head.squeeze(2), position_weight, key_value], dim=2).flatten(1)
        self.projection_bias = torch.cat(
            [(attention.r_w_bias * scale), position_bias.squeeze(1), qkv.new_zeros(heads, 2 * head_dim)], dim=1
        ).flatten()
        self.output_weight = attention.o_net.weight.t().contiguous()
        self.attention_norm = layer.part("attention_norm")
        self.feed_forward_norm = layer.part("feed_forward_norm")
        core = layer.part("feed_forward").CoreNet
        self.feed_forward = (
            core[0].bias,
            core[0].weight.t().contiguous(),
            core[3].bias,
            core[3].weight.t().contiguous(),
        )
        self.gates = ()
        if self.residual == "reordered":
            self.gates = tuple(
                (gate, gate.stacked_weights() if isinstance(gate, GRUGate) else None)
                for gate in (layer.attention_gate, layer.feed_forward_gate)
            )

    def memory_keys_values(self, vectors: torch.Tensor) -> torch.Tensor:
        """The keys and values of memory vectors `[rows, slots, hidden]`, as `[rows, heads, 2 (key, value), head_dim,
        slots]`."""
        context = vectors if self.residual == "post_norm" else _layer_norm(self.attention_norm, vectors)
        rows, slots = vectors.shape[:2]
        key_value = torch.matmul(context, self.key_value_weight).view(rows, slots, 2, self.heads, self.head_dim)
        return key_value.permute(0, 3, 2, 4, 1)

    def gate(self, which: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gate, stacked = self.gates[which]
        return gate(x, y) if stacked is None else GRUGate.fused(x, y, stacked)

    def feed_forward_output(self, x: torch.Tensor) -> torch.Tensor:
        bias_in, weight_in, bias_out, weight_out = self.feed_forward
        return torch.addmm(bias_out, torch.addmm(bias_in, x, weight_in).relu_(), weight_out)

    def __call__(self, hidden: torch.Tensor, memory: StepMemory, index: int) -> torch.Tensor:
        context = hidden if self.residual == "post_norm" else _layer_norm(self.attention_norm, hidden)
        attended = self.attend(hidden, context, memory, index)
        if self.residual == "post_norm":
            hidden = _layer_norm(self.attention_norm, hidden + attended)
            return _layer_norm(self.feed_forward_norm, hidden + self.feed_forward_output(hidden))
        if self.residual == "pre_norm":
            hidden = hidden + attended
            return hidden + self.feed_forward_output(_layer_norm(self.feed_forward_norm, hidden))
        hidden = self.gate(0, hidden, attended.relu_())
        transformed = self.feed_forward_output(_layer_norm(self.feed_forward_norm, hidden))
        return self.gate(1, hidden, transformed.relu_())

    def attend(self, hidden, context, memory: StepMemory, index: int) -> torch.Tensor:
        """The attention output `[rows, hidden]` of the new position over the window; writes the position's memory
        vector, key and value into `memory`."""
        rows, heads, head_dim = hidden.shape[0], self.heads, self.head_dim
        key_count = memory.window_blocked.shape[-1]
        projected = torch.addmm(self.projection_bias, context, self.projection_weight).view(rows, heads, -1)
        keys, values = memory.write(index, hidden, projected[..., head_dim + key_count :])  # [rows * heads, d, K]
        # A_j = (q + u) . k_j + (q + v) . W_r R_(K-1-j): the position term, masked, then the content term (one product
        # per row and head) accumulated into it
        scores = projected[..., head_dim : head_dim + key_count].masked_fill_(memory.window_blocked, float("-inf"))
        content_query = projected[..., :head_dim].view(rows * heads, 1, head_dim)
        weights = torch.baddbmm(scores.view(rows * heads, 1, key_count), content_query, keys).softmax(dim=-1)
        output = torch.bmm(weights, values.transpose(1, 2))  # [rows * heads, 1, head_dim]
        return torch.mm(output.view(rows, heads * head_dim), self.output_weight)


class StepWeights:
    """Every layer's `LayerStepWeights` and the final norm of an XL base model, for the weights `token` names (the
    caller's name for their values, e.g. the parameters' in-place versions)."""

    def __init__(self, model, token: tuple):
        config = model.config
        self.token = token
        key_count = config.mem_len + 1  # the memory and the new position (`step_support` checks the window)
        parameter = next(model.parameters())
        table = relative_position_embeddings(
            key_count, config.hidden_size, getattr(config, "clamp_len", 0), parameter.dtype, parameter.device
        )
        self.layers = [LayerStepWeights(layer, key_count, table) for layer in model.layers]
        self.final_norm = model.norm


class StepMemory:
    """The memory of an acting agent in step buffers (see the module's docstring); `from_cache` / `to_cache` convert
    from and to a `MemoryCache`. A step advances it in place."""

    def __init__(self, vectors: list[torch.Tensor], memory_mask: torch.Tensor, cache_fields: dict):
        rows, mem_len, hidden = vectors[0].shape
        self.mem_len, self.start, self.capacity = mem_len, 0, 2 * mem_len
        self.cache_fields = cache_fields  # num_layers, memory_init, model_type: what `to_cache` gives back
        self.vectors = []
        for layer_vectors in vectors:
            buffer = layer_vectors.new_empty(rows, self.capacity, hidden)
            buffer[:, :mem_len] = layer_vectors
            self.vectors.append(buffer)
        self.blocked = memory_mask.new_ones(rows, self.capacity)
        self.blocked[:, :mem_len] = ~memory_mask
        self.keys_values: list[torch.Tensor] = []  # per layer [rows, heads, 2 (key, value), head_dim, capacity]
        self.window_blocked = None  # `blocked` over this step's window, [rows, 1, mem_len + 1] (set by `begin`)
        self.weights = None  # the `StepWeights` the keys and values were made with

    @classmethod
    def from_cache(cls, cache: MemoryCache) -> StepMemory:
        return cls(
            cache.memories,
            cache.memory_mask,
            {"num_layers": cache.num_layers, "memory_init": cache.memory_init, "model_type": cache.model_type},
        )

    @property
    def memory_length(self) -> int:
        return self.mem_len

    @property
    def batch_size(self) -> int:
        return self.blocked.shape[0]

    def memory(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Views of each layer's memory vectors `[rows, mem_len, hidden]` and the mask `[rows, mem_len]` (True: may be
        attended)."""
        window = slice(self.start, self.start + self.mem_len)
        return [vectors[:, window] for vectors in self.vectors], ~self.blocked[:, window]

    def to_cache(self) -> MemoryCache:
        vectors, mask = self.memory()
        fields = self.cache_fields
        return MemoryCache(
            fields["num_layers"],
            self.mem_len,
            memories=[v.clone() for v in vectors],
            memory_mask=mask,
            memory_init=fields["memory_init"],
            model_type=fields["model_type"],
        )

    def _make_keys_values(self, weights: StepWeights):
        vectors, _ = self.memory()
        window = slice(self.start, self.start + self.mem_len)
        self.keys_values = []
        for layer, layer_vectors in zip(weights.layers, vectors):
            key_value = layer.memory_keys_values(layer_vectors)
            buffer = key_value.new_empty(*key_value.shape[:-1], self.capacity)
            buffer[..., window] = key_value
            self.keys_values.append(buffer)
        self.weights = weights

    def begin(self, weights: StepWeights, episode_starts: torch.Tensor):
        if self.weights is not weights:  # made for other weights (or the same, made again: no harm)
            self._make_keys_values(weights)
        if self.start + self.mem_len == self.capacity:  # no room for the new slot: the window back to the front
            window = slice(self.start, self.capacity)
            for buffer in self.vectors:
                buffer[:, : self.mem_len] = buffer[:, window]
            for buffer in self.keys_values:
                buffer[..., : self.mem_len] = buffer[..., window]
            self.blocked[:, : self.mem_len] = self.blocked[:, window]
            self.start = 0
        new = self.start + self.mem_len
        # a row whose episode starts attends to nothing before it, now or later (`MemoryCache.reset_rows`, "empty")
        self.blocked[:, self.start : new].bitwise_or_(episode_starts[:, None])
        self.blocked.select(1, new).fill_(False)
        self.window_blocked = self.blocked[:, None, self.start : new + 1]

    def write(self, index: int, hidden: torch.Tensor, key_value: torch.Tensor):
        """Writes layer `index`'s new slot (`key_value [rows, heads, 2 * head_dim]`, key then value); returns the
        window's keys and values, each `[rows * heads, head_dim, mem_len + 1]`."""
        new = self.start + self.mem_len
        self.vectors[index].select(1, new).copy_(hidden)
        buffer = self.keys_values[index]
        rows, heads, _, head_dim, _ = buffer.shape
        buffer.select(4, new).copy_(key_value.view(rows, heads, 2, head_dim))
        window = buffer[..., self.start : new + 1]
        shape = (rows * heads, head_dim, self.mem_len + 1)
        return window[:, :, 0].view(shape), window[:, :, 1].view(shape)

    def end(self):
        self.start += 1


def xl_step(weights: StepWeights, memory: StepMemory, inputs: torch.Tensor, episode_starts: torch.Tensor):
    """The last hidden state `[rows, hidden]` of one new position per row (`inputs [rows, hidden]`, the embeddings),
    episode_starts `[rows]` bool; advances `memory` by one slot."""
    memory.begin(weights, episode_starts)
    hidden = inputs
    for index, layer in enumerate(weights.layers):
        hidden = layer(hidden, memory, index)
    memory.end()
    return hidden if weights.final_norm is None else _layer_norm(weights.final_norm, hidden)


__all__ = ["LayerStepWeights", "StepMemory", "StepWeights", "step_support", "xl_step"]
