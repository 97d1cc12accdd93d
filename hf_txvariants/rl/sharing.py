"""Saving, loading and sharing a `MemoryPolicy` (mixed into it, `PolicySharingMixin`): `config.json` (the body, both
spaces, the episode clock; plain JSON, `to_config` / `from_config`) and `model.safetensors`, written through a
temporary sibling folder (`save_pretrained`), read back without unpickling anything (`from_pretrained`, also from a
Hub repo id), and pushed to the Hub with a model card (`push_to_hub`)."""

from __future__ import annotations

import json

from .bodies import BODIES

POLICY_FORMAT = "hf_txvariants.rl.MemoryPolicy"
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


class PolicySharingMixin:
    """`MemoryPolicy`'s saving, loading and sharing (see the module's docstring)."""

    def to_config(self) -> dict:
        """config.json: the body (its kind and config), both spaces and the episode clock's periods if it has one, all
        plain JSON."""
        from .spaces import space_to_dict

        config = {
            "format": POLICY_FORMAT,
            "format_version": 1,
            "body": self.body.to_config(),
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
        }
        if self.clock is not None:  # version 2: a release that reads version 1 only would drop the clock
            config.update(format_version=2, episode_clock=self.clock.periods)
        return config

    @classmethod
    def from_config(cls, config: dict):
        from .spaces import space_from_dict

        if not isinstance(config, dict) or config.get("format") != POLICY_FORMAT:
            found = config.get("format") if isinstance(config, dict) else type(config).__name__
            raise ValueError(f"not a saved MemoryPolicy config (format {found!r}, expected {POLICY_FORMAT!r})")
        if config.get("format_version") not in (1, 2):
            raise ValueError(
                f"saved MemoryPolicy format_version {config.get('format_version')!r} is not supported "
                "(this release reads versions 1 and 2)"
            )
        body = config.get("body")
        if not isinstance(body, dict) or body.get("kind") not in BODIES:
            raise ValueError(f"the saved body must name one of {', '.join(BODIES)} as its 'kind', got {body!r}")
        return cls(
            space_from_dict(config["observation_space"]),
            space_from_dict(config["action_space"]),
            BODIES[body["kind"]].from_config(body),
            config.get("episode_clock"),
        )

    def save_pretrained(self, save_directory) -> list[str]:
        """Writes `config.json` (`to_config`) and `model.safetensors` into `save_directory`, through a temporary
        sibling folder renamed into place: a failure leaves no half-written folder. Returns the file names."""
        from pathlib import Path

        from safetensors.torch import save_file

        from ..txv_pretrained import atomic_directory

        save_directory = Path(save_directory)
        with atomic_directory(save_directory) as staging:
            (staging / CONFIG_NAME).write_text(json.dumps(self.to_config(), indent=2, sort_keys=True) + "\n")
            weights = {name: tensor.detach().cpu().contiguous() for name, tensor in self.state_dict().items()}
            save_file(weights, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        return sorted(p.name for p in save_directory.iterdir() if p.is_file())

    @classmethod
    def from_pretrained(
        cls, name_or_path, device=None, revision: str | None = None, token: str | None = None, cache_dir=None
    ):
        """A policy from a folder `save_pretrained` wrote, or from a Hub repo id (downloading only config.json and
        model.safetensors). Weights are read with safetensors; nothing is unpickled."""
        from pathlib import Path

        from safetensors.torch import load_file

        folder = Path(name_or_path)
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            folder = Path(
                snapshot_download(
                    str(name_or_path),
                    revision=revision,
                    token=token,
                    cache_dir=cache_dir,
                    allow_patterns=[CONFIG_NAME, WEIGHTS_NAME],
                )
            )
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder} has no {name}: not a folder MemoryPolicy.save_pretrained wrote")
        try:
            config = json.loads((folder / CONFIG_NAME).read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{folder / CONFIG_NAME} is not valid JSON: {error}") from None
        policy = cls.from_config(config)
        policy.load_state_dict(load_file(str(folder / WEIGHTS_NAME)))
        return policy.to(device) if device is not None else policy

    def push_to_hub(
        self,
        repo_id: str,
        task: str | None = None,
        mean_return: float | None = None,
        private: bool = False,
        token: str | None = None,
        commit_message: str = "Upload MemoryPolicy",
        api=None,
        revision: str | None = None,
        create_pr: bool = False,
    ):
        """Creates `repo_id` (if needed) and uploads config.json, model.safetensors and a model card (README.md, with
        `task` and `mean_return` in its metadata when given) in one commit. Returns the commit info."""
        import tempfile
        from pathlib import Path

        from huggingface_hub import HfApi

        from ..hub import upload_repo_folder
        from .card import build_policy_card

        api = api or HfApi(token=token)
        with tempfile.TemporaryDirectory(prefix="txv-policy-push-") as tmp:
            folder = Path(tmp) / "repo"
            self.save_pretrained(folder)
            build_policy_card(self, repo_id, task, mean_return).save(folder / "README.md")
            return upload_repo_folder(
                api,
                repo_id,
                folder,
                private=private,
                commit_message=commit_message,
                revision=revision,
                create_pr=create_pr,
            )


__all__ = ["PolicySharingMixin"]
