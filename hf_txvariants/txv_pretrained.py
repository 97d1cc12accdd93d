"""What every hf_txvariants model shares beyond transformers' PreTrainedModel: strict checkpoint loading, safe
(atomic) saving, and the remote-code payload with a full `auto_map` so a saved folder loads without the plugin."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from torch import nn
from transformers import initialization as init
from transformers.dynamic_module_utils import get_relative_import_files

WEIGHT_FILE_PATTERN = re.compile(r"^(model.*\.safetensors|pytorch_model.*\.bin)(\.index\.json)?$")


@contextmanager
def atomic_directory(target: str | os.PathLike, keep_existing: bool = True):
    """Yields a temporary folder next to `target` that replaces `target` only if the block succeeds (the one
    atomic-folder helper of the project: model saving and the converters use it).

    With `keep_existing`, files already in `target` that the block did not write are kept (e.g. a tokenizer saved
    before the model), except stale weight files; without it `target` is replaced as a whole. On failure the
    temporary folder is removed and `target` is left as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield staging
        if target.is_dir():
            for old in target.iterdir() if keep_existing else ():
                if not (staging / old.name).exists() and not WEIGHT_FILE_PATTERN.match(old.name):
                    (shutil.copytree if old.is_dir() else shutil.copy2)(old, staging / old.name)
            backup = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, backup)
            os.replace(staging, target)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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
        _replace_file(folder / Path(source).name, Path(source).read_bytes())
    modeling_module = Path(modeling_file).stem
    auto_map = {"AutoConfig": f"{Path(config_file).stem}.{config_class.__name__}"}
    auto_map.update({auto: f"{modeling_module}.{name}" for auto, name in model_class.auto_classes.items()})
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = auto_map
    _replace_file(config_path, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return sorted(Path(source).name for source in code_files) + ["config.json"]


def _replace_file(path: Path, content: bytes):
    """Writes `content` to `path` through a temporary file in the same folder and an atomic rename."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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


class TxvModelMixin:
    """Mixed into every `<V>PreTrainedModel` (before PreTrainedModel), with the flags every variant shares (the base
    model under `model`, gradient checkpointing, the cache never moved by device hooks) and the standard
    `_init_weights`, which a variant extends for its own parameters.

    Subclasses set `auto_classes` ({"AutoModel": "<V>Model", ...}) and `head_key_patterns` (regexes of the task-head
    parameters, which may be missing or unexpected when a checkpoint of one head is loaded into another)."""

    auto_classes: dict[str, str] = {}
    head_key_patterns: tuple[str, ...] = ()
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = ["cache", "past_key_values"]

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
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        if strict_weights:
            is_head = lambda key: any(re.search(pattern, key) for pattern in cls.head_key_patterns)  # noqa: E731
            missing = sorted(k for k in info["missing_keys"] if not is_head(k))
            unexpected = sorted(k for k in info["unexpected_keys"] if not is_head(k))
            if missing or unexpected:
                source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
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
