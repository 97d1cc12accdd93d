"""One step of an XL-family stack over a sliding memory window, one new position per row and call, each layer attending
to its last `mem_len` memory slots and the new position: what the models' `forward_step`, the one door into it,
runs for an agent acting in many environments at once (`hf_txvariants.rl.GTrXLBody`) and for `generate()` feeding one
token per row.

The models' `forward_segment` gives the same outputs for any segment length, padding and mechanism. For one position
per row that generality is most of the cost: about 310 aten ops, 60 module calls and the cache's bookkeeping per step
of the RL benchmark's 2-layer GTrXL in 16 environments, where each small kernel takes ~3 us on a CPU
(benchmarks/RESULTS.md, "Acting speed"). Here that step is 110 aten ops, on state kept in the form a step needs:

- `StepWeights`: made once per version of the weights (`token`, kept by the caller). Every matrix transposed for
  `torch.addmm`; 1 / sqrt(head_dim) folded into W_q and u; the position term (q + v) . W_r R_(K-1-j), linear in the
  layer's normed input, as a product with W_q (W_r R)_h per head and the bias v . (W_r R)_h (key slot j of the window
  always sits at distance K - 1 - j from the new position, so these are constants). The query, the position term (folded
  where that stays small, else a product of q + v with (W_r R)_h per head), the key and the value come from one product,
  its columns grouped by head so that each part is a view with one stride per (row, head), as the batched products need.
  A GRU gate's stacked matrices (`GRUGate.stacked_weights`, for `GRUGate.fused`, the gate's own maths).
- `StepMemory`: the `MemoryCache`'s memory in the step's layout, owned by the cache (`MemoryCache.step_layout`): per
  layer the memory vectors (the inputs the layer saw) and their keys and values, `[rows, heads, 2, head_dim, slots]`,
  in buffers with room for `mem_len` more slots. The window is a view; a step writes one slot per buffer and moves the
  view by one, and every `mem_len` steps the window is copied to the front of new buffers (so that no view handed out,
  e.g. the cache's `memories`, ever changes, as with `AppendBuffers` on the general path). `blocked [rows, slots]`, one
  for all layers, marks the slots a row may not attend: empty ones, and those before its episode's start; the slots
  after the window are kept unmarked, so a step's new slot needs no write there.

The keys and values of the memory belong to the weights that made them: after an optimiser step they are made again
from the memory vectors, as the general path does. Against the general path the maths is the same with the float
operations in another order: equal within float32 rounding (`tests/test_xl_step.py`). `step_support` says why a model
cannot step here (the caller then runs the general path): adaptive span, wrapped (e.g. PEFT) or other non-plain parts,
shared u / v biases. An attention window shorter than the memory plus the new position (Transformer-XL's
`same_length`) is served by attending the last keys of the window only.
"""

from __future__ import annotations

import operator

import torch
from torch import nn
from torch.nn import functional as F

from .txv_feedforward import PositionwiseFeedForward
from .txv_gates import GatingLayer, GRUGate
from .txv_relative_attention import RelativePositionAttention, relative_position_embeddings
from .txv_xl_config import attention_window

# the most weights (hidden x heads x key slots) for which a layer's position term is folded into its projection
FOLDED_POSITION_LIMIT = 1 << 16
# the config fields that decide whether and how a model steps here (`attention_window`, `step_support`): the models
# keep what they made for the step per setting of these
STEP_SETTING_FIELDS = ("mem_len", "same_length", "same_length_extra_key", "attn_span", "adapt_span_enabled")
parameter_version = operator.attrgetter("_version")  # a tensor's in-place version counter


def _computes_as(module: nn.Module, base: type, methods: tuple[str, ...]) -> bool:
    """`module` is a `base`, or a subclass that only adds to it (e.g. transfo-xl's attention, which holds its layer
    norm), overriding none of `methods`."""
    return isinstance(module, base) and all(getattr(type(module), name) is getattr(base, name) for name in methods)


def step_support(model) -> str | None:
    """None if `model` (an XL-family base model, e.g. `GTrXLModel`) can step here, else why not (in words). Its
    layers' parts are read under the names of their roles (`attention`, `attention_norm`, `feed_forward`,
    `feed_forward_norm`, `attention_gate`, `feed_forward_gate`), as `LayerStepWeights` reads them."""
    config = model.config
    if config.mem_len <= 0:
        return "mem_len is 0 (no memory to slide)"
    if getattr(config, "adapt_span_enabled", False):
        return "adaptive span (its spans cut the keys per layer)"
    window = attention_window(config)
    if window is not None and window < 1:
        return f"the attention window ({window} keys) holds no key"
    for index, layer in enumerate(model.layers):
        attention = layer.attention
        if not _computes_as(attention, RelativePositionAttention, ("forward", "project", "attend_one_query")):
            return f"layer {index}'s attention is not a RelativePositionAttention (or computes otherwise)"
        if not hasattr(attention, "r_w_bias"):
            return f"layer {index}'s attention shares its u / v biases with the other layers"
        plain = (attention.qkv_net, attention.r_net, attention.o_net)
        if any(type(module) is not nn.Linear for module in plain):
            return f"layer {index}'s attention projections are wrapped (not plain nn.Linear)"
        norms = (layer.attention_norm, layer.feed_forward_norm)
        if any(type(norm) is not nn.LayerNorm for norm in norms):
            return f"layer {index}'s norms are not plain nn.LayerNorm"
        feed_forward = layer.feed_forward
        if not _computes_as(feed_forward, PositionwiseFeedForward, ("forward",)) or any(
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
        attention = layer.attention
        self.residual = layer.residual
        self.heads, self.head_dim = attention.num_heads, attention.head_dim
        heads, head_dim = self.heads, self.head_dim
        inner = heads * head_dim
        scale = attention.scaling
        qkv = attention.qkv_net.weight
        query_weight = qkv[:inner].t() * scale  # [hidden, inner]
        self.key_value_weight = qkv[inner:].t().contiguous()  # [hidden, keys then values]
        # The position term (q + v) . W_r R_(K-1-j), key slot j of the window at distance K - 1 - j (row j of the
        # table). Linear in the context, it can be folded into the projection (W_q (W_r R)_h per head h, whose
        # columns are the key slots, and the bias v . (W_r R)_h): no op of its own, but hidden x heads x K weights
        # where (W_r R)_h alone has head_dim x K. Folded where that stays small (an RL agent's width), else a product
        # of q + v with (W_r R)_h per head (Transformer-XL's sizes: 8x the weights otherwise).
        positions = F.linear(position_table[:key_count], attention.r_net.weight)  # [K, inner]
        position_keys = positions.view(key_count, heads, head_dim).permute(1, 2, 0)  # [heads, d, K]
        by_head = query_weight.view(-1, heads, 1, head_dim)
        fold_position = query_weight.shape[0] * heads * key_count <= FOLDED_POSITION_LIMIT
        content_bias = attention.r_w_bias * scale  # u, [heads, d]
        # One product gives a step everything else its attention needs, grouped by head so that each part is a view
        # with one stride per (row, head): [query + u, (position term + its bias,) key, value].
        key_value = self.key_value_weight.view(-1, 2, heads, head_dim).transpose(1, 2).flatten(2)  # [hidden, heads, 2d]
        parts, biases = [by_head.squeeze(2)], [content_bias]
        if fold_position:
            parts.append((by_head @ position_keys).squeeze(2))  # [hidden, heads, K]
            biases.append(((attention.r_r_bias * scale)[:, None] @ position_keys).squeeze(1))  # [heads, K]
            self.position_count = key_count
        else:
            self.position_keys = position_keys.contiguous()
            self.position_shift = (attention.r_r_bias * scale - content_bias).view(1, heads, head_dim)  # v - u
            self.position_count = 0
        parts.append(key_value)
        biases.append(qkv.new_zeros(heads, 2 * head_dim))
        self.projection_weight = torch.cat(parts, dim=2).flatten(1)
        self.projection_bias = torch.cat(biases, dim=1).flatten()
        self.output_weight = attention.o_net.weight.t().contiguous()
        self.attention_norm = layer.attention_norm
        self.feed_forward_norm = layer.feed_forward_norm
        core = layer.feed_forward.CoreNet
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
        key_count, folded = memory.window_blocked.shape[-1], self.position_count
        projected = torch.addmm(self.projection_bias, context, self.projection_weight).view(rows, heads, -1)
        keys, values = memory.write(index, hidden, projected[..., head_dim + folded :])  # [rows * heads, d, K]
        # A_j = (q + u) . k_j + (q + v) . W_r R_(K-1-j): the position term, masked, then the content term (one product
        # per row and head) accumulated into it
        content_query = projected[..., :head_dim]
        if folded:
            scores = projected[..., head_dim : head_dim + key_count]
        else:  # (q + v) = (q + u) + (v - u), times (W_r R)_h for each head
            position_query = (content_query + self.position_shift).transpose(0, 1)  # [heads, rows, d]
            scores = torch.bmm(position_query, self.position_keys).transpose(0, 1)  # [rows, heads, K]
        scores = scores.masked_fill_(memory.window_blocked, float("-inf")).reshape(rows * heads, 1, key_count)
        content_query = content_query.view(rows * heads, 1, head_dim)
        weights = torch.baddbmm(scores, content_query, keys).softmax(dim=-1)
        output = torch.bmm(weights, values.transpose(1, 2))  # [rows * heads, 1, head_dim]
        return torch.mm(output.view(rows, heads * head_dim), self.output_weight)


class StepWeights:
    """Every layer's `LayerStepWeights` and the final norm of an XL base model, for the weights `token` names (the
    caller's name for their values, e.g. the parameters' in-place versions)."""

    def __init__(self, model, token: tuple):
        config = model.config
        self.token = token
        # the memory and the new position, or the last keys of them that the attention window lets a query see
        # (Transformer-XL's same_length: mem_len)
        window = attention_window(config)
        key_count = self.key_count = config.mem_len + 1 if window is None else min(window, config.mem_len + 1)
        parameter = next(model.parameters())
        table = relative_position_embeddings(
            key_count, config.hidden_size, getattr(config, "clamp_len", 0), parameter.dtype, parameter.device
        )
        self.layers = [LayerStepWeights(layer, key_count, table) for layer in model.layers]
        self.final_norm = model.norm


def _window_in_front(buffer: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    """A new buffer like `buffer` holding its `length` slots from `start` (along `dim`) at the front."""
    fresh = buffer.new_empty(buffer.shape)
    fresh.narrow(dim, 0, length).copy_(buffer.narrow(dim, start, length))
    return fresh


class StepMemory:
    """A `MemoryCache`'s memory in the layout of the step (see the module's docstring): the cache makes it from its
    state (`MemoryCache.step_layout`, `from_state`) and reads its window back (`memory`). A step advances it in
    place."""

    def __init__(self, vectors: list[torch.Tensor], memory_mask: torch.Tensor):
        rows, mem_len, hidden = vectors[0].shape
        self.mem_len, self.start, self.capacity = mem_len, 0, 2 * mem_len
        self.vectors = []
        for layer_vectors in vectors:
            buffer = layer_vectors.new_empty(rows, self.capacity, hidden)
            buffer[:, :mem_len] = layer_vectors
            self.vectors.append(buffer)
        # the slots after the window are never blocked: each becomes a step's new slot, which every key may see
        self.blocked = memory_mask.new_zeros(rows, self.capacity)
        self.blocked[:, :mem_len] = ~memory_mask
        self.keys_values: list[torch.Tensor] = []  # per layer [rows, heads, 2 (key, value), head_dim, capacity]
        self.key_count = mem_len + 1  # the keys a step attends: the last of the window (set by `begin`)
        self.window_blocked = None  # `blocked` over the keys a step attends, [rows, 1, key_count] (set by `begin`)
        self.weights = None  # the `StepWeights` the keys and values were made with

    @classmethod
    def from_state(cls, state: dict, mem_len: int | None = None) -> StepMemory:
        """The memory of a `MemoryCache.to_state()` in step buffers of `mem_len` slots (default: the memory's
        length); a shorter memory (a prompt shorter than mem_len) gets blocked empty slots in front."""
        memory, mask = state["memory"], state["memory_mask"]
        missing = (mem_len or memory.shape[2]) - memory.shape[2]
        if missing < 0:
            raise ValueError(f"the memory holds {memory.shape[2]} slots, more than mem_len={mem_len}")
        if missing:
            memory = F.pad(memory, (0, 0, missing, 0))
            mask = F.pad(mask, (missing, 0), value=False)
        return cls(list(memory.unbind(1)), mask)

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

    def map_rows(self, fn):
        """Applies `fn` (a `[rows, ...] -> [rows', ...]` selection, e.g. beam search's reordering) to every buffer."""
        self.vectors = [fn(buffer) for buffer in self.vectors]
        self.keys_values = [fn(buffer) for buffer in self.keys_values]
        self.blocked = fn(self.blocked)

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

    def begin(self, weights: StepWeights, episode_starts: torch.Tensor | None):
        if self.weights is not weights:  # made for other weights (or the same, made again: no harm)
            self._make_keys_values(weights)
        if self.start + self.mem_len == self.capacity:
            # no room for the new slot: the window moves to the front of new buffers (a view handed out, such as a
            # `MemoryCache`'s memory after a step, never changes afterwards)
            self.vectors = [_window_in_front(buffer, 1, self.start, self.mem_len) for buffer in self.vectors]
            self.keys_values = [_window_in_front(buffer, 4, self.start, self.mem_len) for buffer in self.keys_values]
            window = slice(self.start, self.capacity)
            self.blocked[:, : self.mem_len] = self.blocked[:, window]
            self.blocked[:, self.mem_len :] = False
            self.start = 0
        new = self.start + self.mem_len
        if episode_starts is not None:
            # a row whose episode starts attends to nothing before it, now or later (`MemoryCache.reset_rows`,
            # "empty")
            self.blocked[:, self.start : new].bitwise_or_(episode_starts[:, None])
        self.key_count = weights.key_count
        self.window_blocked = self.blocked[:, None, new + 1 - self.key_count : new + 1]

    def write(self, index: int, hidden: torch.Tensor, key_value: torch.Tensor):
        """Writes layer `index`'s new slot (`key_value [rows, heads, 2 * head_dim]`, key then value); returns the
        keys and values a step attends (the last `key_count` of the window and the new slot), each `[rows * heads,
        head_dim, key_count]`."""
        new = self.start + self.mem_len
        self.vectors[index].select(1, new).copy_(hidden)
        buffer = self.keys_values[index]
        rows, heads, _, head_dim, _ = buffer.shape
        buffer.select(4, new).copy_(key_value.view(rows, heads, 2, head_dim))
        window = buffer[..., new + 1 - self.key_count : new + 1]
        shape = (rows * heads, head_dim, self.key_count)
        return window[:, :, 0].view(shape), window[:, :, 1].view(shape)

    def end(self):
        self.start += 1


def xl_step(
    weights: StepWeights,
    memory: StepMemory,
    inputs: torch.Tensor,
    episode_starts: torch.Tensor | None,
    layer_inputs: list | None = None,
):
    """The last hidden state `[rows, hidden]` of one new position per row (`inputs [rows, hidden]`, the embeddings),
    episode_starts `[rows]` bool or None (no episodes, e.g. text); advances `memory` by one slot. `layer_inputs`, if
    given, gets each layer's input `[rows, hidden]`."""
    memory.begin(weights, episode_starts)
    hidden = inputs
    for index, layer in enumerate(weights.layers):
        if layer_inputs is not None:
            layer_inputs.append(hidden)
        hidden = layer(hidden, memory, index)
    memory.end()
    return hidden if weights.final_norm is None else _layer_norm(weights.final_norm, hidden)


__all__ = [
    "STEP_SETTING_FIELDS",
    "LayerStepWeights",
    "StepMemory",
    "StepWeights",
    "parameter_version",
    "step_support",
    "xl_step",
]
