"""The model card (Hub README.md with metadata) of a shared `MemoryPolicy`."""

from __future__ import annotations


def build_policy_card(policy, repo_id: str, task: str | None = None, mean_return: float | None = None):
    """A `huggingface_hub.ModelCard`: reinforcement-learning metadata (library, tags, the task, `mean_reward` in the
    model-index when measured, as RL cards on the Hub carry it) and a body saying what the policy is and how to run
    it."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    body = policy.body.to_config()
    kind = body["kind"]
    if kind == "gtrxl":
        config = body["config"]
        kind_tag = "trxl-i" if config.get("gate_type") == "trxl_i" else "gtrxl"
        described = (
            f"GTrXL (gate {config.get('gate_type')}), {config.get('num_hidden_layers')} layers x "
            f"{config.get('hidden_size')}, {config.get('num_attention_heads')} heads, mem_len "
            f"{config.get('mem_len')}"
        )
    else:
        kind_tag, described = kind, f"{kind.upper()} of width {body['hidden_size']}"
    if policy.clock is not None:
        periods = ", ".join(f"{period:g}" for period in policy.clock.periods)
        described += f", with an episode clock (the step within the episode, periods {periods})"
    tags = ["reinforcement-learning", "hf-txvariants", "memory", kind_tag] + ([task] if task else [])
    eval_results = None
    if task is not None and mean_return is not None:
        eval_results = [
            EvalResult(
                task_type="reinforcement-learning",
                dataset_type=task,
                dataset_name=task,
                metric_type="mean_reward",
                metric_name="mean return",
                metric_value=round(float(mean_return), 4),
            )
        ]
    data = ModelCardData(
        library_name="hf-txvariants", tags=tags, model_name=repo_id.split("/")[-1], eval_results=eval_results
    )
    task_line = f"Trained on `{task}`" + (f": mean return {mean_return:.4f}." if mean_return is not None else ".")
    run_task = task or "TASK"
    text = f"""
# {repo_id.split("/")[-1]}

A `hf_txvariants.rl.MemoryPolicy`: an actor-critic with a memory ({described}; {policy.num_parameters:,}
parameters), trained with PPO on stored segments (`hf_txvariants.rl.train_ppo`, or RLlib's PPO through
`hf_txvariants.rl.rllib`). {task_line if task else ""}

- observation space: `{policy.observation_space}`
- action space: `{policy.action_space}`

## Use

```python
from hf_txvariants.rl import MemoryPolicy

policy = MemoryPolicy.from_pretrained("{repo_id}")
actions, state = policy.predict(observations, state=None, episode_start=starts, deterministic=True)
```

or, with `pip install "hf-txvariants[rl]"`:

```bash
python -m hf_txvariants.rl.evaluate --policy {repo_id} --task {run_task} --episodes 100
```

The files: `config.json` (the body, its config, both spaces and any episode clock, plain JSON) and
`model.safetensors`.
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{text}")


__all__ = ["build_policy_card"]
