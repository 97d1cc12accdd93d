"""Where each process trains, and FSDP2 (`torch.distributed.fsdp.fully_shard`) for the Accelerate training loop.

Device per rank: a process uses a GPU only when every process of its machine has one of its own (NCCL refuses two
ranks on one GPU); otherwise every process trains on the CPU and the processes talk over gloo.

FSDP: `accelerate launch --config_file examples/accelerate_configs/fsdp.yaml` exports the config as environment
variables (ACCELERATE_USE_FSDP, FSDP_VERSION, FSDP_*, ACCELERATE_MIXED_PRECISION). Accelerate 1.15 turns FSDP on only
for GPU-like devices (on CPU it silently runs DDP), so the loop shards the model itself, on GPUs and on CPU alike:
one `fully_shard` unit per layer class named by the model's `_no_split_modules`, then the root. The model is not passed
to `accelerator.prepare` (no DDP wrapper), the optimizer is built on the sharded parameters, and checkpoints hold each
rank's own shards (model and optimizer, `torch.save` / `torch.load(weights_only=True)`). Whatever in the config this
loop cannot honour is refused with one line (a `ModelError`), never ignored."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .models import ModelError

MIXED_PRECISION_CHOICES = ("no", "bf16")
SHARD_FILE = "fsdp_shards_rank{rank}.pt"


def announce(message: str):
    """One line `txv: message` on stderr in a single write, so that the lines of several ranks do not interleave."""
    sys.stderr.write(f"txv: {message}\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class DeviceChoice:
    cpu: bool  # train on the CPU (processes talk over gloo); False: one accelerator per process
    note: str | None = None  # why the GPUs are not used although there are some


def choose_device(local_world_size: int, gpu_count: int, force_cpu: bool = False, mps: bool = False) -> DeviceChoice:
    """GPU only when each of the `local_world_size` processes on this machine gets its own; else CPU (gloo)."""
    if force_cpu:
        return DeviceChoice(cpu=True)
    if 0 < local_world_size <= gpu_count:
        return DeviceChoice(cpu=False)
    if gpu_count > 0:
        return DeviceChoice(
            cpu=True,
            note=(
                f"{local_world_size} processes on this machine but {gpu_count} GPU(s): every process trains on the CPU "
                f"(gloo); start at most one process per GPU to train on the GPUs"
            ),
        )
    return DeviceChoice(cpu=not (mps and local_world_size == 1))


def device_choice_from_environment(force_cpu: bool = False, environ=os.environ) -> DeviceChoice:
    """`choose_device` for this process: LOCAL_WORLD_SIZE from torchrun / accelerate launch, the visible GPUs, and
    `--cpu` or `accelerate launch --cpu` (ACCELERATE_USE_CPU)."""
    return choose_device(
        int(environ.get("LOCAL_WORLD_SIZE", "1")),
        torch.cuda.device_count(),
        force_cpu or _flag(environ, "ACCELERATE_USE_CPU"),
        mps=torch.backends.mps.is_available(),
    )


def resolve_mixed_precision(flag: str | None, fsdp: bool, environ=os.environ) -> str:
    """The explicit `--mixed-precision` flag wins; without it the launcher's (the Accelerate config's) setting.
    Under FSDP only "no" and "bf16" (fp16 would need a sharded gradient scaler)."""
    chosen = flag if flag is not None else environ.get("ACCELERATE_MIXED_PRECISION", "no")
    choices = MIXED_PRECISION_CHOICES if fsdp else MIXED_PRECISION_CHOICES + ("fp16",)
    if chosen not in choices:
        source = "--mixed-precision" if flag is not None else "the Accelerate config's mixed_precision"
        raise ModelError(
            f"{source} is {chosen!r}; this training loop supports {', '.join(choices)}"
            + (" under FSDP" if fsdp else "")
        )
    return chosen


@dataclass(frozen=True)
class FsdpSettings:
    reshard_after_forward: bool = True
    wrap_classes: tuple[str, ...] | None = None  # None: the model's _no_split_modules; (): only the root unit


def _flag(environ, name: str, default: str = "false") -> bool:
    return environ.get(name, default).strip().lower() in ("1", "true", "yes")


def fsdp_requested(environ=os.environ) -> bool:
    """Whether the process was started by `accelerate launch` with an FSDP config."""
    return _flag(environ, "ACCELERATE_USE_FSDP")


def fsdp_settings_from_environment(environ=os.environ) -> FsdpSettings | None:
    """The FSDP part of the Accelerate config (None when it does not ask for FSDP). Raises ModelError, one line, for
    a setting this loop cannot honour."""
    if not fsdp_requested(environ):
        return None
    if "LOCAL_RANK" not in environ:  # set by torchrun, which accelerate launch runs
        raise ModelError(
            "FSDP is asked for (ACCELERATE_USE_FSDP) but this process was not started by "
            "`accelerate launch` or torchrun: start it with `accelerate launch --config_file ...`"
        )
    version = environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise ModelError(
            f"the Accelerate config asks for fsdp_version {version}; this training loop shards with "
            "FSDP2 (fully_shard) only: set fsdp_version: 2"
        )
    refused = {
        "FSDP_OFFLOAD_PARAMS": "fsdp_offload_params: true",
        "FSDP_ACTIVATION_CHECKPOINTING": "fsdp_activation_checkpointing: true",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "fsdp_cpu_ram_efficient_loading: true",
    }
    for name, setting in refused.items():
        if _flag(environ, name):
            raise ModelError(
                f"the Accelerate config sets {setting}, which this training loop does not support: set it to false"
            )
    state_dict_type = environ.get("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT")
    if state_dict_type != "SHARDED_STATE_DICT":
        raise ModelError(
            f"the Accelerate config sets fsdp_state_dict_type {state_dict_type}; this training loop "
            "writes sharded checkpoints (one file per rank): set SHARDED_STATE_DICT"
        )
    policy = environ.get("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    if policy == "TRANSFORMER_BASED_WRAP":
        names = environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")
        wrap_classes = tuple(n.strip() for n in names.split(",") if n.strip()) or None
    elif policy == "NO_WRAP":
        wrap_classes = ()
    else:
        raise ModelError(
            f"the Accelerate config sets fsdp_auto_wrap_policy {policy}; this training loop supports "
            "TRANSFORMER_BASED_WRAP (one unit per layer) or NO_WRAP"
        )
    return FsdpSettings(
        reshard_after_forward=_flag(environ, "FSDP_RESHARD_AFTER_FORWARD", "true"), wrap_classes=wrap_classes
    )


class ShardedModel:
    """A model sharded with FSDP2 over all processes, with what the loop needs around it: gradient clipping over the
    shards, the full state dict for `save_pretrained`, and per-rank checkpoints through Accelerate's state hooks."""

    def __init__(self, model, settings: FsdpSettings, device: torch.device, world_size: int, mixed_precision: str):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if not torch.distributed.is_initialized():
            raise ModelError("FSDP needs a process group: build the Accelerator under `accelerate launch` or torchrun")
        names = settings.wrap_classes if settings.wrap_classes is not None else tuple(model._no_split_modules or ())
        if getattr(model.config, "reversible", False):
            raise ModelError(
                f"FSDP cannot train the reversible layers of {model.config.model_type}: their backward "
                "takes gradients against the parameters themselves, which FSDP swaps for gathered copies; "
                "pass --extra-config '{\"reversible\": false}' or train without FSDP"
            )
        units = [m for m in model.modules() if type(m).__name__ in names]
        missing = sorted(set(names) - {type(m).__name__ for m in units})
        if missing:
            raise ModelError(
                f"FSDP: {type(model).__name__} has no module of class {', '.join(missing)} to shard "
                "(fsdp_transformer_layer_cls_to_wrap or the model's _no_split_modules)"
            )
        # bf16: parameters gathered and computed in bf16, gradients reduced and master weights kept in fp32
        self.policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if mixed_precision == "bf16"
            else MixedPrecisionPolicy()
        )
        self.model_class = type(model)  # fully_shard swaps in a subclass FSDP<name> defined in torch's own module
        mesh = init_device_mesh(device.type, (world_size,))
        model.to(device)
        for unit in units:
            fully_shard(unit, mesh=mesh, mp_policy=self.policy, reshard_after_forward=settings.reshard_after_forward)
        self.module = fully_shard(
            model, mesh=mesh, mp_policy=self.policy, reshard_after_forward=settings.reshard_after_forward
        )
        self.units = len(units) + 1

    def local_fraction(self) -> tuple[int, int]:
        """(parameter elements held by this rank, parameter elements of the whole model)."""
        params = list(self.module.parameters())
        return sum(p.to_local().numel() for p in params), sum(p.numel() for p in params)

    def describe(self, rank: int, world_size: int, device) -> str:
        local, total = self.local_fraction()
        compute = str(self.policy.param_dtype or torch.float32).replace("torch.", "")
        reduce = str(self.policy.reduce_dtype or self.policy.param_dtype or torch.float32).replace("torch.", "")
        return (
            f"FSDP2 fully_shard, {self.units} units: rank {rank}/{world_size} on {device} holds {local:,} of "
            f"{total:,} parameter elements ({100 * local / total:.1f}%); compute {compute}, gradients reduced "
            f"in {reduce}"
        )

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clips the gradients to a global norm `max_norm`; the norm is summed over every rank's shards."""
        from torch.distributed.tensor import DTensor

        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm

    def full_state_dict(self) -> dict:
        """The whole model's state dict on CPU on the main process (empty elsewhere); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def save_pretrained(self, folder: str | Path, state_dict: dict, **kwargs):
        """`save_pretrained` under the model's own class: with FSDP's subclass, transformers would record torch's FSDP
        module in the config's auto_map and copy its files next to the weights."""
        fsdp_class = self.module.__class__
        self.module.__class__ = self.model_class
        try:
            self.module.save_pretrained(folder, state_dict=state_dict, **kwargs)
        finally:
            self.module.__class__ = fsdp_class

    def save_shards(self, optimizer, folder: str | Path, rank: int):
        """This rank's shards of the model and the optimizer state, as plain tensors."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.module, optimizer)
        Path(folder).mkdir(parents=True, exist_ok=True)
        torch.save(
            {"model": _to_local(model_state), "optimizer": _to_local(optim_state)},
            Path(folder) / SHARD_FILE.format(rank=rank),
        )

    def load_shards(self, optimizer, folder: str | Path, rank: int):
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = Path(folder) / SHARD_FILE.format(rank=rank)
        if not path.exists():
            raise ModelError(
                f"cannot resume from {folder}: no {path.name} (the checkpoint was not written by an "
                "FSDP run with this many processes)"
            )
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model_template, optim_template = get_state_dict(self.module, optimizer)
        set_state_dict(
            self.module,
            optimizer,
            model_state_dict=_like(model_template, saved["model"]),
            optim_state_dict=_like(optim_template, saved["optimizer"]),
        )


def _to_local(state):
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return {k: _to_local(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_to_local(v) for v in state)
    if isinstance(state, DTensor):
        return state.to_local().detach().cpu()
    return state.detach().cpu() if isinstance(state, torch.Tensor) else state


def _like(template, saved):
    """`saved` (plain tensors) laid out like `template`: each local shard back into a DTensor of the same placement."""
    from torch.distributed.tensor import DTensor

    if isinstance(template, dict):
        return {k: _like(v, saved[k]) for k, v in template.items()}
    if isinstance(template, (list, tuple)):
        return type(template)(_like(t, s) for t, s in zip(template, saved))
    if isinstance(template, DTensor):
        local = saved.to(device=template.device, dtype=template.dtype)
        return DTensor.from_local(
            local, template.device_mesh, template.placements, shape=template.shape, stride=template.stride()
        )
    if isinstance(template, torch.Tensor):
        return saved.to(device=template.device, dtype=template.dtype)
    return saved


def register_checkpoint_hooks(accelerator, sharded: ShardedModel | None, optimizer):
    """FSDP: each rank's shards go into (and come back from) the folder of `accelerator.save_state`. Without FSDP:
    a checkpoint written by an FSDP run is refused on load, one line, instead of failing inside Accelerate."""
    rank = accelerator.process_index
    if sharded is not None:
        accelerator.register_save_state_pre_hook(
            lambda models, weights, folder: sharded.save_shards(optimizer, folder, rank)
        )
        accelerator.register_load_state_pre_hook(lambda models, folder: sharded.load_shards(optimizer, folder, rank))
        return

    def refuse_sharded(models, folder):
        if any(Path(folder).glob(SHARD_FILE.format(rank="*"))):
            raise ModelError(
                f"cannot resume from {folder}: it was written by an FSDP run; resume it with the same "
                "FSDP Accelerate config"
            )

    accelerator.register_load_state_pre_hook(refuse_sharded)


class hidden_from_accelerate:
    """Builds the Accelerator with ACCELERATE_USE_FSDP hidden, so that Accelerate runs plain multi-process (gloo or
    NCCL) on GPUs and CPU alike and leaves the sharding to `ShardedModel`."""

    def __enter__(self):
        self.saved = os.environ.pop("ACCELERATE_USE_FSDP", None)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            os.environ["ACCELERATE_USE_FSDP"] = self.saved
        return False
