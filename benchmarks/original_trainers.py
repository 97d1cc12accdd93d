"""The papers' own trainers, run from a clone of their repositories with the fewest patches: kimiyoung/transformer-xl
`pytorch/train.py` and facebookresearch/adaptive-span `main.py`. Used by benchmarks/bench_trainer_parity.py and
tests/fixtures/make_trainer_parity_fixtures.py; nothing of the originals is committed (their files are copied from a
clone into a temporary folder and patched there).

    git clone https://github.com/kimiyoung/transformer-xl /tmp/orig/txl
    git clone https://github.com/facebookresearch/adaptive-span /tmp/orig/adaptive-span

Every change made to the originals is one entry of `TRANSFO_XL_PATCHES` or `ADAPTIVE_SPAN_PATCHES` (file, the text
replaced, its replacement, why), of three kinds:
* "torch": what today's torch (2.13) needs to run 2019 code (uint8 masks, a CUDA probe on a CPU build, weights-only
  loading, Adagrad's tensor step counter and removed positional `addcmul_` / `addcdiv_` signatures, CUDA-only setup);
* "float64": casts to float32 inside the original that a float64 run must not make (no-ops in float32, so the float32
  runs are the original's arithmetic as written);
* "record": the instrumentation: the initial weights saved as the original saves a model, each step's loss, rate and
  time, the validation loss, written as JSON; the seeds of the adaptive-span trainer, which seeds nothing.
A patch whose text is not found stops the run (the clone is not the code the patches were written for).

The parity run's environment: TXV_PARITY_OUT (the JSON record), TXV_PARITY_INIT (where the initial model is saved),
TXV_PARITY_DTYPE (float64: the model is cast after its initialisation, which stays the float32 one),
TXV_PARITY_SEED (adaptive-span: the seed of torch and of the module `random` that draws its data offsets).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Patch:
    file: str
    old: str
    new: str
    kind: str  # "torch", "float64" or "record"
    why: str
    count: int = 1  # how many times `old` stands in the file (all are replaced)


TRANSFO_XL_FILES = (
    "pytorch/train.py",
    "pytorch/mem_transformer.py",
    "pytorch/data_utils.py",
    "pytorch/utils/adaptive_softmax.py",
    "pytorch/utils/data_parallel.py",
    "pytorch/utils/exp_utils.py",
    "pytorch/utils/log_uniform_sampler.py",
    "pytorch/utils/proj_adaptive_softmax.py",
    "pytorch/utils/vocabulary.py",
)

_INIT_LINE = (
    "    model.word_emb.apply(weights_init) # ensure embedding init is not overridden by out_layer in case of "
    "weight sharing"
)
_RECORD_INIT = (
    _INIT_LINE
    + """
    if os.environ.get('TXV_PARITY_INIT'):
        torch.save(model, os.environ['TXV_PARITY_INIT'])
if os.environ.get('TXV_PARITY_DTYPE') == 'float64':
    model = model.double()"""
)

_RECORD_END = """# Load the best saved model.
if os.environ.get('TXV_PARITY_OUT'):
    import json
    _parity.pop('step_loss'); _parity.pop('started')
    with open(os.environ['TXV_PARITY_OUT'], 'w') as _f:
        json.dump(_parity, _f)
    if os.environ.get('TXV_PARITY_FINAL'):
        torch.save(model, os.environ['TXV_PARITY_FINAL'])
    sys.exit(0)"""

TRANSFO_XL_PATCHES = (
    Patch(
        "mem_transformer.py",
        "+ torch.tril(all_ones, -mask_shift_len)).byte()[:, :, None]",
        "+ torch.tril(all_ones, -mask_shift_len)).bool()[:, :, None]",
        "torch",
        "masked_fill takes boolean masks only (uint8 masks were removed)",
    ),
    Patch(
        "mem_transformer.py",
        "diagonal=1+mlen).byte()[:,:,None]",
        "diagonal=1+mlen).bool()[:,:,None]",
        "torch",
        "masked_fill takes boolean masks only",
    ),
    Patch(
        "mem_transformer.py",
        "indices_i = mask_i.nonzero().squeeze()",
        "indices_i = mask_i.nonzero().view(-1)",
        "torch",
        "a single match gave a 0-d index, which index_select refuses",
    ),
    Patch(
        "utils/proj_adaptive_softmax.py",
        "indices_i = mask_i.nonzero().squeeze()",
        "indices_i = mask_i.nonzero().view(-1)",
        "torch",
        "a single match gave a 0-d index, which index_select refuses",
    ),
    Patch(
        "utils/proj_adaptive_softmax.py",
        "CUDA_MAJOR = int(torch.version.cuda.split('.')[0])\nCUDA_MINOR = int(torch.version.cuda.split('.')[1])",
        "CUDA_MAJOR = CUDA_MINOR = 0",
        "torch",
        "torch.version.cuda is None on a CPU build (the numbers are read nowhere)",
    ),
    Patch(
        "data_utils.py",
        "corpus = torch.load(fn)",
        "corpus = torch.load(fn, weights_only=False)",
        "torch",
        "torch.load is weights-only by default now; cache.pt is the run's own corpus cache",
    ),
    Patch(
        "mem_transformer.py",
        "attn_score = attn_score.float().masked_fill(",
        "attn_score = attn_score.masked_fill(",
        "float64",
        "the attention scores are masked in float32 (a no-op for float32 runs)",
        count=2,
    ),
    Patch(
        "train.py",
        "loss = loss.float().mean().type_as(loss)",
        "loss = loss.mean()",
        "float64",
        "the training loss is averaged in float32 (a no-op for float32 runs)",
        count=2,
    ),
    Patch(
        "train.py",
        "total_loss += seq_len * loss.float().item()",
        "total_loss += seq_len * loss.item()",
        "float64",
        "each validation batch's loss is rounded to float32 (a no-op for float32 runs)",
    ),
    Patch(
        "train.py",
        _INIT_LINE,
        _RECORD_INIT,
        "record",
        "save the initial model as train.py saves models (torch.save of the module); cast it for a float64 run",
    ),
    Patch(
        "train.py",
        "args.tied = not args.not_tied\n",
        "args.tied = not args.not_tied\n"
        "_parity = {'step_losses': [], 'step_lrs': [], 'step_seconds': [], 'valid_losses': [], 'step_loss': 0.0, "
        "'started': 0.0}\n",
        "record",
        "the record",
    ),
    Patch(
        "train.py",
        "    for batch, (data, target, seq_len) in enumerate(train_iter):\n        model.zero_grad()\n",
        "    for batch, (data, target, seq_len) in enumerate(train_iter):\n        model.zero_grad()\n"
        "        _parity['step_loss'], _parity['started'] = 0.0, time.perf_counter()\n",
        "record",
        "a step's loss and time start",
    ),
    Patch(
        "train.py",
        "train_loss += loss.float().item()",
        "train_loss += loss.float().item(); _parity['step_loss'] += loss.item()",
        "record",
        "the step's loss (a chunk's loss is already divided by batch_chunk)",
        count=2,
    ),
    Patch(
        "train.py",
        "        optimizer.step()\n        if args.sample_softmax > 0:\n            optimizer_sparse.step()\n",
        "        _parity['step_lrs'].append(optimizer.param_groups[0]['lr'])\n"
        "        optimizer.step()\n        if args.sample_softmax > 0:\n            optimizer_sparse.step()\n",
        "record",
        "the rate the step runs at",
    ),
    Patch(
        "train.py",
        "        train_step += 1\n",
        "        train_step += 1\n        _parity['step_losses'].append(_parity['step_loss'])\n"
        "        _parity['step_seconds'].append(time.perf_counter() - _parity['started'])\n",
        "record",
        "the step's loss and seconds (data, forward, backward, clipping, optimiser)",
    ),
    Patch(
        "train.py",
        "            val_loss = evaluate(va_iter)\n",
        "            val_loss = evaluate(va_iter)\n"
        "            _parity['valid_losses'].append([train_step, val_loss])\n",
        "record",
        "the validation loss with all its digits",
    ),
    Patch(
        "train.py",
        "# Load the best saved model.",
        _RECORD_END,
        "record",
        "write the record (and, with TXV_PARITY_FINAL, the final model) and stop: the test-set evaluation of the best "
        "checkpoint is not compared",
    ),
)

ADAPTIVE_SPAN_FILES = (
    "main.py",
    "config.py",
    "data.py",
    "models.py",
    "trainer.py",
    "utils.py",
    "adaptive_span.py",
    "adaptive_io.py",
    "persistent_memory.py",
    "adagrad_with_grad_clip.py",
)

_SPANS = (
    "[float(l.attn.attn.adaptive_span._mask.current_val.mean()) * l.attn.attn.adaptive_span._max_span"
    " for l in model.module.layers]"
)

ADAPTIVE_SPAN_PATCHES = (
    Patch(
        "utils.py",
        "    assert torch.cuda.is_available()\n",
        "",
        "torch",
        "the trainer requires CUDA; it runs on the CPU here (device below)",
    ),
    Patch(
        "utils.py",
        "    env_params['device'] = torch.device('cuda')",
        "    env_params['device'] = torch.device('cpu')",
        "torch",
        "CPU",
    ),
    Patch(
        "adagrad_with_grad_clip.py",
        "                clr = (group['lr'] /\n                       (1 + (state['step'] - 1) * group['lr_decay']))",
        "                clr = (group['lr'] /\n"
        "                       (1 + (float(state['step']) - 1) * group['lr_decay']))",
        "torch",
        "Adagrad's step counter is a float32 tensor now: the step size became a float32 tensor (lr 0.07 rounded)",
    ),
    Patch(
        "adagrad_with_grad_clip.py",
        "state['sum'].addcmul_(1, grad, grad)",
        "state['sum'].addcmul_(grad, grad, value=1)",
        "torch",
        "addcmul_'s positional scalar signature was removed",
    ),
    Patch(
        "adagrad_with_grad_clip.py",
        "p.data.addcdiv_(-clr, grad, std)",
        "p.data.addcdiv_(grad, std, value=-clr)",
        "torch",
        "addcdiv_'s positional scalar signature was removed",
    ),
    Patch(
        "data.py",
        "        corpus = torch.load(corpus_path)\n    else:",
        "        corpus = torch.load(corpus_path, weights_only=False)\n    else:",
        "torch",
        "torch.load is weights-only by default now; corpus.pt is the run's own corpus cache",
    ),
    Patch(
        "main.py",
        "    set_up_env(env_params)\n",
        "    set_up_env(env_params)\n    import json, os, random\n"
        "    _seed = int(os.environ.get('TXV_PARITY_SEED', '0'))\n"
        "    torch.manual_seed(_seed)\n    random.seed(_seed)\n",
        "record",
        "the original seeds nothing: torch (the initialisation, dropout) and `random` (its data offsets) are seeded",
    ),
    Patch(
        "main.py",
        "    # OPTIMIZER AND SCHEDULER\n",
        "    if os.environ.get('TXV_PARITY_INIT'):\n"
        "        torch.save({'iter_no': -1, 'model': model.state_dict()}, os.environ['TXV_PARITY_INIT'])\n"
        "    if os.environ.get('TXV_PARITY_DTYPE') == 'float64':\n"
        "        model = model.double()\n        torch.set_default_dtype(torch.float64)\n"
        "    # OPTIMIZER AND SCHEDULER\n",
        "record",
        "save the initial weights as its save_checkpoint saves them; a float64 run casts the model after its "
        "(float32) initialisation and makes its caches in float64",
    ),
    Patch(
        "main.py",
        "    # position of current batch\n",
        "    _parity = {'step_losses': [], 'step_lrs': [], 'step_seconds': [], 'spans': []}\n"
        "    import trainer as _trainer\n    _trainer.PARITY = _parity\n"
        "    # position of current batch\n",
        "record",
        "the record",
    ),
    Patch(
        "main.py",
        "        save_checkpoint(trainer_params['checkpoint_path'],\n"
        "                        iter_no, model, optimizer, scheduler, logger)\n",
        "        save_checkpoint(trainer_params['checkpoint_path'],\n"
        "                        iter_no, model, optimizer, scheduler, logger)\n"
        "    with torch.no_grad():\n"
        "        _parity['valid_loss'] = full_eval(model, optimizer, scheduler, val_data,\n"
        "                                          model_params['block_size'], model_params['hidden_size'])\n"
        "    if os.environ.get('TXV_PARITY_OUT'):\n"
        "        with open(os.environ['TXV_PARITY_OUT'], 'w') as _f:\n"
        "            json.dump(_parity, _f)\n",
        "record",
        "the validation loss of the final model as its --full-eval-mode computes it, and the record",
    ),
    Patch(
        "trainer.py",
        "    optimizer.zero_grad()\n\n    if batch_split == 1:",
        "    optimizer.zero_grad()\n    _started = time.perf_counter()\n\n    if batch_split == 1:",
        "record",
        "a step's time",
    ),
    Patch(
        "trainer.py",
        "        optimizer.step()\n",
        "        PARITY['step_lrs'].append(optimizer.param_groups[0]['lr'])\n        optimizer.step()\n",
        "record",
        "the rate the step runs at",
    ),
    Patch(
        "trainer.py",
        "                layer.attn.attn.adaptive_span.clamp_param()\n\n    return loss_value, h_cache",
        "                layer.attn.attn.adaptive_span.clamp_param()\n"
        "        PARITY['step_losses'].append(loss_value)\n"
        "        if model.module.layers[0].attn.attn.adapt_span_enabled:\n"
        "            PARITY['spans'].append(" + _SPANS + ")\n"
        "        PARITY['step_seconds'].append(time.perf_counter() - _started)\n\n    return loss_value, h_cache",
        "record",
        "the step's loss (before the span penalty, as the original logs it), seconds and learned spans (each "
        "layer's mean, in positions)",
    ),
    Patch(
        "trainer.py",
        "import math\nimport random\n",
        "import math\nimport random\nimport time\n\nPARITY = {}\n",
        "record",
        "the record",
    ),
)


def _read_original(clone: Path, path: str) -> str:
    """A file of the clone: from its work tree, or (a bare git mirror) from HEAD."""
    if (clone / path).is_file():
        return (clone / path).read_text(encoding="utf-8")
    return subprocess.check_output(["git", "-C", str(clone), "show", f"HEAD:{path}"], text=True)


def prepare(clone: Path, files: tuple[str, ...], patches: tuple[Patch, ...], strip: str = "") -> Path:
    """A temporary folder holding `files` of `clone` (without the prefix `strip`) with `patches` applied; refuses a
    clone where a patch's text is not found as many times as written."""
    folder = Path(tempfile.mkdtemp(prefix="txv-original-"))
    for path in files:
        target = folder / path.removeprefix(strip)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_read_original(clone, path), encoding="utf-8")
    for patch in patches:
        target = folder / patch.file
        text = target.read_text(encoding="utf-8")
        if text.count(patch.old) != patch.count:
            raise SystemExit(
                f"{clone}: the patch for {patch.file} ({patch.why}) expects its text {patch.count} time(s), found "
                f"{text.count(patch.old)}: this clone is not the code the patches were written for"
            )
        target.write_text(text.replace(patch.old, patch.new), encoding="utf-8")
    return folder


def prepare_transfo_xl(clone: Path) -> Path:
    return prepare(Path(clone), TRANSFO_XL_FILES, TRANSFO_XL_PATCHES, strip="pytorch/")


def prepare_adaptive_span(clone: Path) -> Path:
    return prepare(Path(clone), ADAPTIVE_SPAN_FILES, ADAPTIVE_SPAN_PATCHES)


def run_original(
    code: Path,
    script: str,
    flags: list[str],
    record: Path,
    dtype: str = "float32",
    init: Path | None = None,
    seed: int | None = None,
    threads: int = 1,
    log: Path | None = None,
) -> dict:
    """Runs `script` of a prepared folder with `flags` in a fresh interpreter on `threads` CPU threads; returns its
    record (step_losses, step_lrs, step_seconds, and the validation loss)."""
    env = {
        **os.environ,
        "TXV_PARITY_OUT": str(record),
        "TXV_PARITY_DTYPE": dtype,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONWARNINGS": "ignore",
    }
    if init is not None:
        env["TXV_PARITY_INIT"] = str(init)
    if seed is not None:
        env["TXV_PARITY_SEED"] = str(seed)
    with open(log or os.devnull, "w") as out:
        result = subprocess.run(
            [sys.executable, script, *flags], cwd=code, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    if result.returncode != 0:
        tail = Path(log).read_text()[-3000:] if log else ""
        raise RuntimeError(f"the original {script} failed (exit {result.returncode}) {flags}\n{tail}")
    return json.loads(Path(record).read_text())


def patch_table(patches: tuple[Patch, ...]) -> list[dict]:
    """The patches as data (for the benchmark's JSON)."""
    return [{"file": p.file, "kind": p.kind, "why": p.why} for p in patches]
