"""Sharing models on the Hub: a repo folder (safetensors weights, config with the full `auto_map`, the remote-code
payload written by `TxvPreTrainedModel.save_pretrained`, the tokenizer, and a model card with Hub metadata) and its
upload.

The card's body comes from `model_cards/<name>.md` when given (the cards of converted checkpoints), else from
`model_card_template.md`; its metadata (library_name, tags, pipeline_tag, model-index with the measured metrics) is
always filled from the model and the metrics."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

TEMPLATE = Path(__file__).with_name("model_card_template.md")

# metric name -> (model-index metric type, display name, the `metrics:` id: the plugin's metric of that name)
METRIC_TYPES = {
    "valid_bpc": ("bpc", "validation bits per character", "bits_per_character"),
    "test_bpc": ("bpc", "test bits per character", "bits_per_character"),
    "valid_perplexity": ("perplexity", "validation perplexity", "perplexity"),
    "test_perplexity": ("perplexity", "test perplexity", "perplexity"),
    "accuracy": ("accuracy", "accuracy", "accuracy"),
    "eval_accuracy": ("accuracy", "evaluation accuracy", "accuracy"),
}

CONFIG_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "intermediate_size",
    "mem_len",
    "clamp_len",
    "same_length",
    "memory_init",
    "cutoffs",
    "max_position_embeddings",
    "position_embedding_type",
    "dropout",
)


def _pipeline_tag(model) -> str:
    name = type(model).__name__
    if "SequenceClassification" in name:
        return "text-classification"
    if name.startswith("ImageTransformer"):
        return "unconditional-image-generation"
    return "text-generation"


def build_model_card(
    model,
    repo_id: str,
    metrics: dict | None = None,
    dataset: str | None = None,
    base_card: str | Path | None = None,
    training: str | None = None,
    license: str = "apache-2.0",
):
    """A `huggingface_hub.ModelCard`: metadata (library_name, tags, pipeline_tag, model-index from `metrics`) and a
    body from `base_card` (a model_cards/*.md file) or the template filled with the config and the metrics."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    config = model.config
    metrics = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))}
    name = repo_id.split("/")[-1]
    task = _pipeline_tag(model)
    dataset_name = dataset or "custom text"
    eval_results = [
        EvalResult(
            task_type=task,
            dataset_type=dataset_name.replace(" ", "-"),
            dataset_name=dataset_name,
            metric_type=METRIC_TYPES[key][0],
            metric_name=METRIC_TYPES[key][1],
            metric_value=round(value, 4),
        )
        for key, value in metrics.items()
        if key in METRIC_TYPES
    ]
    tags = ["hf-txvariants", config.model_type, "custom_code"]
    if config.model_type == "transfo-xl":
        tags.append("transformer-xl")
    metric_ids = sorted({METRIC_TYPES[key][2] for key in metrics if key in METRIC_TYPES})
    data = ModelCardData(
        library_name="transformers",
        license=license,
        tags=tags,
        pipeline_tag=task,
        model_name=name,
        eval_results=eval_results or None,
        datasets=[dataset] if dataset else None,
        metrics=metric_ids or None,
    )
    if base_card is not None:
        base = ModelCard.load(str(base_card))
        merged = base.data.to_dict()
        merged.update({k: v for k, v in data.to_dict().items() if v is not None and k != "tags"})
        merged["tags"] = sorted(set(base.data.to_dict().get("tags") or []) | set(tags))
        for key in ("datasets", "metrics"):  # the base card's lists, and what this upload adds
            merged[key] = sorted(set(base.data.to_dict().get(key) or []) | set(data.to_dict().get(key) or [])) or None
        return ModelCard(f"---\n{ModelCardData(**merged).to_yaml()}\n---\n{base.text}")
    metrics_table = (
        "\n".join(["| metric | value |", "|---|---|"] + [f"| {k} | {v:.4f} |" for k, v in metrics.items()])
        if metrics
        else "No metrics were measured."
    )
    rows = [(f, getattr(config, f)) for f in CONFIG_FIELDS if hasattr(config, f)]
    rows.append(("parameters", f"{sum(p.numel() for p in model.parameters()):,}"))
    config_table = "\n".join(["| field | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows])
    body = TEMPLATE.read_text().format(
        model_name=name,
        repo_id=repo_id,
        variant_title=type(model).__name__,
        metrics_table=metrics_table,
        config_table=config_table,
        training=training or f"Trained on {dataset_name}.",
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def save_for_hub(model, folder: str | Path, repo_id: str, tokenizer=None, metrics: dict | None = None, **card_kwargs):
    """Writes the complete repo folder: weights (safetensors), config with auto_map, remote code, tokenizer, README.md.
    Returns the sorted list of file names."""
    folder = Path(folder)
    model.save_pretrained(folder)  # TxvPreTrainedModel: safetensors + remote-code payload with the full auto_map
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    build_model_card(model, repo_id, metrics, **card_kwargs).save(folder / "README.md")
    if metrics:
        (folder / "eval_results.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def push_to_hub(
    model,
    repo_id: str,
    tokenizer=None,
    metrics: dict | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload hf-txvariants model",
    api=None,
    revision: str | None = None,
    create_pr: bool = False,
    **card_kwargs,
):
    """Creates `repo_id` (if needed) and uploads the folder of `save_for_hub` in one commit (or one pull request with
    `create_pr`) with `huggingface_hub.HfApi.upload_folder`. Returns the commit info.

    `model.push_to_hub` from transformers uploads the weights, the config and the remote-code payload too, but not
    this model card with its Hub metadata (and measured metrics) nor the tokenizer; this does all in one commit."""
    from huggingface_hub import HfApi

    api = api or HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="txv-push-") as tmp:
        folder = Path(tmp) / "repo"
        save_for_hub(model, folder, repo_id, tokenizer, metrics, **card_kwargs)
        return upload_repo_folder(
            api, repo_id, folder, private=private, commit_message=commit_message, revision=revision, create_pr=create_pr
        )


def upload_repo_folder(
    api, repo_id: str, folder, *, private: bool, commit_message: str, revision: str | None, create_pr: bool
):
    """Creates the model repo `repo_id` (if needed) and uploads `folder` in one commit (or one pull request with
    `create_pr`) with `huggingface_hub.HfApi.upload_folder`. Returns the commit info."""
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    return api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        repo_type="model",
        commit_message=commit_message,
        revision=revision,
        create_pr=create_pr,
    )


def snapshot_into_cache(
    folder: str | Path, repo_id: str, cache_dir: str | Path, revision: str = "main", commit: str = "0" * 40
) -> Path:
    """Lays `folder` out as huggingface_hub's cache holds a downloaded repo (`models--org--name/snapshots/<commit>`,
    `refs/<revision>`), so `from_pretrained(repo_id)` finds it with HF_HUB_OFFLINE=1. For tests and air-gapped
    machines; returns the snapshot folder."""
    import shutil

    repo_folder = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_folder / "snapshots" / commit
    shutil.copytree(folder, snapshot, dirs_exist_ok=True)
    (repo_folder / "refs").mkdir(parents=True, exist_ok=True)
    (repo_folder / "refs" / revision).write_text(commit)
    return snapshot


__all__ = ["build_model_card", "push_to_hub", "save_for_hub", "snapshot_into_cache", "upload_repo_folder"]


def refresh_code(folder: str | Path) -> list[str]:
    """Replaces the model code that a saved or downloaded model folder carries (its remote-code payload and
    `auto_map`) with the installed plugin's, leaving the weights and everything else untouched: a folder saved
    before a fix (e.g. before the plugin supported transformers 5.24) then loads with `trust_remote_code=True` on
    the releases the plugin supports. The plugin's `txv_*` blocks that no code file of the folder imports any more
    (e.g. `txv_heads.py` of a folder saved before the heads were written into the modeling files) are removed, so
    the folder holds only the code its model runs. Returns the names of the files written. Also
    `txv refresh-code FOLDER`."""
    from transformers.dynamic_module_utils import get_relative_import_files

    import hf_txvariants

    from ..txv_pretrained import write_code_payload

    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a saved model folder")
    try:
        model_type = json.loads(config_path.read_text()).get("model_type")
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from None
    if model_type not in hf_txvariants.VARIANTS:
        raise ValueError(
            f"{config_path}: model_type {model_type!r} is not a variant of this plugin "
            f"(known: {', '.join(sorted(hf_txvariants.VARIANTS))})"
        )
    written = write_code_payload(*hf_txvariants.VARIANTS[model_type], folder)
    entry_files = [path for path in folder.glob("*.py") if not path.name.startswith("txv_")]
    imported = {Path(name).name for path in entry_files for name in get_relative_import_files(str(path))}
    for stale in sorted(folder.glob("txv_*.py")):
        if stale.name not in imported:
            stale.unlink()
    return written
