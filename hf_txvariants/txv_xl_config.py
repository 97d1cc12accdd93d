"""The base config of the XL family (Transformer-XL, Gated Transformer-XL, Adaptive Span): the fields of the shared
backbone (`txv_xl`) declared once, so that every mechanism is an option of every XL-family config: the segment
memory (`mem_len`, `memory_init`), the residual form (`gate_type`, `gate_bias`, `final_layer_norm`; Parisotto et al.
2020), the adaptive attention span (`attn_span`, `adapt_span_*`; Sukhbaatar et al. 2019) and Transformer-XL's
adaptive embedding and softmax for large vocabularies (`adaptive`, `cutoffs`, `div_val`, `d_embed`, `tie_projs`; off
by default). Each variant keeps its own defaults, names and extra fields."""

from __future__ import annotations

from .txv_adaptive_span import check_span_fields
from .txv_compat import CACHE_OUTPUT_KEYS
from .txv_config import TxvTransformerConfig
from .txv_config_checks import (
    check_choice,
    check_even,
    check_left_at_default,
    check_non_negative,
    check_positive,
    integer_list,
)
from .txv_gates import GATES, check_gate_fields

MEMORY_INITS = ("zeros", "empty")
# The adaptive-span settings that mean something only with `adapt_span_enabled` (`attn_span` alone is a hard window).
ADAPTIVE_SPAN_SETTINGS = (
    "adapt_span_ramp",
    "adapt_span_init",
    "adapt_span_loss",
    "adapt_span_cache",
    "adapt_span_dynamic",
)


def attention_window(config) -> int | None:
    """How many keys (distances 0 .. window - 1) a query may see: the smallest of the same-length window
    (`mem_len` keys, or `mem_len + 1` with `same_length_extra_key`) and the hard span `attn_span`; None: no limit."""
    windows = []
    if getattr(config, "same_length", False):
        windows.append(config.mem_len + int(getattr(config, "same_length_extra_key", False)))
    if config.attn_span is not None:
        windows.append(config.attn_span)
    return min(windows) if windows else None


class XLFamilyConfig(TxvTransformerConfig):
    """The XL backbone's fields (see the module docstring and each variant's config for their meaning)."""

    keys_to_ignore_at_inference = CACHE_OUTPUT_KEYS

    mem_len: int = 64
    memory_init: str = "empty"
    gate_type: str = "trxl"
    gate_bias: float | int = 2.0
    final_layer_norm: bool = False
    attn_span: int | None = None
    adapt_span_enabled: bool = False
    adapt_span_ramp: int = 32
    adapt_span_init: float = 0.0
    adapt_span_loss: float = 2e-6
    adapt_span_cache: bool = True
    adapt_span_dynamic: bool = False
    adaptive: bool = False
    cutoffs: list[int] | tuple[int, ...] = ()
    d_embed: int | None = None
    div_val: int = 1
    tie_projs: list[bool] | None = None

    @property
    def uses_adaptive_softmax(self) -> bool:
        """Whether the adaptive embedding and softmax are built (their fields are checked then only)."""
        return self.adaptive

    def derive_defaults(self, kwargs: dict):
        derive_adaptive_softmax_defaults(self, kwargs)
        super().derive_defaults(kwargs)

    def validate_architecture(self):
        super().validate_architecture()
        if self.uses_adaptive_softmax:
            check_adaptive_softmax_fields(self)
        check_even(self, "hidden_size", "sinusoidal relative positions")
        check_non_negative(self, "mem_len")
        check_choice(self, "memory_init", MEMORY_INITS)
        check_gate_fields(self)
        check_span_fields(self)
        if not (self.gate_type in GATES and GATES[self.gate_type].has_bias):
            gates_with_bias = [name for name, gate in GATES.items() if gate.has_bias]
            check_left_at_default(
                self,
                ["gate_bias"],
                f"gate_type={self.gate_type!r} has no gate bias (the {', '.join(gates_with_bias)} gates have one)",
            )
        if not self.adapt_span_enabled:
            check_left_at_default(self, ADAPTIVE_SPAN_SETTINGS, "adaptive span is off (adapt_span_enabled=False)")


def derive_adaptive_softmax_defaults(config, kwargs: dict):
    """`cutoffs` as a list of ints, `d_embed` (default hidden_size) and `tie_projs` (default from the legacy
    `proj_share_all_but_first`: True -> `[False, True, ...]`, the first cluster's projection untied)."""
    proj_share_all_but_first = kwargs.pop("proj_share_all_but_first", True)
    config.cutoffs = integer_list(config, "cutoffs")
    if config.d_embed is None:
        config.d_embed = config.hidden_size
    if config.tie_projs is None:
        config.tie_projs = [False] + [bool(proj_share_all_but_first)] * len(config.cutoffs)


def check_adaptive_softmax_fields(config):
    """The clusters of the adaptive embedding and softmax: `cutoffs` strictly increasing and below `vocab_size`,
    every cluster's embedding (`d_embed // div_val**i`) non-empty, one `tie_projs` entry per cluster."""
    check_positive(config, "d_embed")
    if config.div_val < 1:
        raise ValueError(f"div_val must be >= 1, got {config.div_val}")
    if list(config.cutoffs) != sorted(set(config.cutoffs)) or any(c <= 0 for c in config.cutoffs):
        raise ValueError(f"cutoffs must be strictly increasing positive integers, got {config.cutoffs}")
    if config.cutoffs and config.cutoffs[-1] >= config.vocab_size:
        raise ValueError(f"cutoffs must be below vocab_size ({config.vocab_size}), got {config.cutoffs}")
    if config.d_embed // (config.div_val ** len(config.cutoffs)) < 1:
        raise ValueError(
            f"d_embed ({config.d_embed}) is too small for div_val={config.div_val} with {len(config.cutoffs)} "
            "cutoffs: the last cluster would have an empty embedding"
        )
    if len(config.tie_projs) != len(config.cutoffs) + 1:
        raise ValueError(f"tie_projs needs one entry per cluster ({len(config.cutoffs) + 1}), got {config.tie_projs}")


__all__ = [
    "ADAPTIVE_SPAN_SETTINGS",
    "MEMORY_INITS",
    "XLFamilyConfig",
    "attention_window",
    "check_adaptive_softmax_fields",
    "derive_adaptive_softmax_defaults",
]
