"""What every hf_txvariants model shares beyond transformers' PreTrainedModel: strict checkpoint loading, safe
(atomic) saving, and the remote-code payload with a full `auto_map` so a saved folder loads without the plugin."""

from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path

from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import get_relative_import_files

from .txv_compat import CACHE_OUTPUT_KEYS
from .txv_files import atomic_directory, atomic_write_bytes


def write_remote_code(model, folder: str | os.PathLike):
    """Copies the model's configuration and modeling files, with every `txv_*` file they import, into `folder` and
    writes an `auto_map` entry for every Auto class the variant supports into its config.json."""
    write_code_payload(type(model.config), type(model), folder)


def write_code_payload(config_class, model_class, folder: str | os.PathLike) -> list[str]:
    """`write_remote_code` for a variant given by its classes (`model_class` names the Auto classes through
    `auto_classes`). Every file is replaced atomically, config.json last, so the weights are never touched and an
    interruption leaves each file whole (old or new). Returns the names of the files written."""
    folder = Path(folder)
    config_file = inspect.getfile(config_class)
    modeling_file = inspect.getfile(model_class)
    code_files = {config_file, modeling_file}
    for source in (config_file, modeling_file):
        code_files.update(get_relative_import_files(source))
    for source in sorted(code_files):
        atomic_write_bytes(folder / Path(source).name, Path(source).read_bytes())
    modeling_module = Path(modeling_file).stem
    auto_map = {"AutoConfig": f"{Path(config_file).stem}.{config_class.__name__}"}
    auto_map.update({auto: f"{modeling_module}.{name}" for auto, name in model_class.auto_classes.items()})
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = auto_map
    atomic_write_bytes(config_path, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return sorted(Path(source).name for source in code_files) + ["config.json"]


def init_standard_weights(module: nn.Module, std: float):
    """The usual initialisation: N(0, std) Linear and Embedding weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        init.normal_(module.weight, 0.0, std)
        if module.bias is not None:
            init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        init.normal_(module.weight, 0.0, std)
    elif isinstance(module, nn.LayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (name -> dtype, shape, data_offsets), checked against the file's size;
    a ValueError says what is wrong (read here, as the format defines it: 8 bytes of little-endian header length,
    then the header)."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
        length = int.from_bytes(prefix, "little")
        if length > size - 8:
            raise ValueError(f"a header of {length} bytes in a file of {size}")
        try:
            header = json.loads(file.read(length))
        except ValueError:
            raise ValueError("the header is not JSON") from None
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    if 8 + length + end > size:
        raise ValueError(f"the tensors need {8 + length + end} bytes, the file has {size}")
    return header


def explain_loading_error(model_class, source, error: Exception) -> Exception | None:
    """An error naming the file or the config field for what `from_pretrained` of a local folder reports in library
    terms, or None: a safetensors file that is truncated or has an absurd header ("Error while deserializing header"),
    and a config.json whose sizes are not the weights' (transformers: "You set `ignore_mismatched_sizes` to `False`
    ... look at the above report")."""
    folder = Path(source) if isinstance(source, (str, os.PathLike)) and Path(source).is_dir() else None
    if folder is None:
        return None
    weight_files = sorted(folder.glob("*.safetensors"))
    if type(error).__name__ == "SafetensorError":
        for path in weight_files:
            try:
                safetensors_header(path)
            except ValueError as reason:
                return OSError(
                    f"{path} cannot be read ({reason}; safetensors: {str(error).splitlines()[0]}): the "
                    "weights file is truncated or damaged"
                )
        return None
    if not (isinstance(error, RuntimeError) and "ignore_mismatched_sizes" in str(error)):
        return None
    import torch

    config = model_class.config_class.from_pretrained(folder)
    with torch.device("meta"):
        expected = {key: tuple(value.shape) for key, value in model_class(config).state_dict().items()}
    stored = json.loads((folder / "config.json").read_text())
    prefix = model_class.base_model_prefix + "."
    mismatches = []
    for path in weight_files:
        for key, entry in safetensors_header(path).items():
            model_key = next((k for k in (key, prefix + key, key.removeprefix(prefix)) if k in expected), None)
            shape = tuple(entry["shape"]) if key != "__metadata__" else None
            if model_key is not None and shape != expected[model_key]:
                mismatches.append((path.name, key, shape, expected[model_key]))
    if not mismatches:
        return None

    def fields_of(shape, wanted):  # the config's integer fields equal to a size that differs
        sizes = {value for got, value in zip(shape, wanted) if got != value} or set(wanted)
        return sorted(
            field
            for field, value in config.to_dict().items()
            if type(value) is int and value in sizes and not field.endswith("_id")
        )

    # the first tensor whose size is a config field (others are derived: vocab_size minus a cutoff, ...)
    name, key, shape, wanted = next((m for m in mismatches if fields_of(m[2], m[3])), mismatches[0])
    fields = fields_of(shape, wanted)
    said = [
        f"{field} = {getattr(config, field)}" + ("" if field in stored else " (not in config.json: the default)")
        for field in fields
    ]
    return ValueError(
        f"{folder / 'config.json'} does not match the weights in {name}: {key} is {list(shape)} there, "
        f"{list(wanted)} from the config"
        + (f" ({', '.join(said)})" if said else "")
        + f"; {len(mismatches)} tensor(s) differ. Fix config.json or use the config saved with these weights."
    )


class TxvPreTrainedModel(PreTrainedModel):
    """The base of every `<V>PreTrainedModel`: transformers' PreTrainedModel with the flags every variant shares (the
    base model under `model`, gradient checkpointing, the cache never moved by device hooks), the standard
    `_init_weights`, which a variant extends for its own parameters, strict loading and atomic saving.

    Subclasses set `auto_classes` ({"AutoModel": "<V>Model", ...}) and `head_key_patterns` (regexes of the task-head
    parameters, which may be missing or unexpected when a checkpoint of one head is loaded into another)."""

    auto_classes: dict[str, str] = {}
    head_key_patterns: tuple[str, ...] = ()
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = CACHE_OUTPUT_KEYS

    def _init_weights(self, module):
        init_standard_weights(module, self.config.initializer_range)

    def output_flags(self, output_attentions: bool | None, output_hidden_states: bool | None) -> tuple[bool, bool]:
        """`output_attentions` and `output_hidden_states` of a call, each from the config where not given."""
        config = self.config
        return (
            config.output_attentions if output_attentions is None else output_attentions,
            config.output_hidden_states if output_hidden_states is None else output_hidden_states,
        )

    @classmethod
    def from_pretrained(cls, *args, strict_weights: bool = True, **kwargs):
        """transformers' `from_pretrained`, but a checkpoint whose backbone tensors are missing or unknown is an
        error naming them (pass `strict_weights=False` to only warn), and pickles are never executed."""
        if kwargs.get("weights_only") is False:
            raise ValueError("weights_only=False is refused: hf_txvariants never executes pickled code from a file")
        want_info = kwargs.pop("output_loading_info", False)
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        try:
            model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        except Exception as error:
            explained = explain_loading_error(cls, source, error)
            if explained is None:
                raise
            raise explained from None
        if strict_weights:
            is_head = lambda key: any(re.search(pattern, key) for pattern in cls.head_key_patterns)  # noqa: E731
            missing = sorted(k for k in info["missing_keys"] if not is_head(k))
            unexpected = sorted(k for k in info["unexpected_keys"] if not is_head(k))
            if missing or unexpected:
                raise ValueError(
                    f"The checkpoint {source} does not match {cls.__name__} built from its config: "
                    f"missing tensors {missing or 'none'}; unexpected tensors {unexpected or 'none'}. "
                    "Check that config.json belongs to these weights (or pass strict_weights=False)."
                )
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Saves safetensors weights, config and the remote-code payload; a failure leaves no half-written folder."""
        if kwargs.get("push_to_hub"):
            return super().save_pretrained(save_directory, *args, **kwargs)
        with atomic_directory(save_directory) as staging:
            super().save_pretrained(staging, *args, **kwargs)
            write_remote_code(self, staging)
