"""Accelerate training: ordered per-rank segment streams, two gloo processes == one process, resume after a kill ==
an uninterrupted run, gradient accumulation == the whole batch, and clear one-line errors for bad input."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest
import torch

from hf_txvariants.cli import main
from hf_txvariants.training import TrainArgs, read_metrics, segment_stream, train
from hf_txvariants.training.data import DataError, build_char_tokenizer, default_corpus, encode, load_text
from hf_txvariants.txv_compat import output_cache
from tiny_configs import TINY_TRAINING, TINY_TRAINING_FLAGS

TINY = TINY_TRAINING
TINY_FLAGS = TINY_TRAINING_FLAGS


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


# A training process that SIGKILLs itself right after step KILL_AT (the test's own hook: no test switch lives in the
# production loop).
KILLED_RUN = """
import os, sys
from hf_txvariants.cli import build_parser
from hf_txvariants.cli.train import train_args_from
from hf_txvariants.training.loop import train
kill_at = int(sys.argv[1])
args = build_parser().parse_args(["train", *sys.argv[2:]])
train(train_args_from(args), on_step=lambda step: step == kill_at and os.kill(os.getpid(), 9))
"""


def _losses(folder) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(folder) if m["split"] == "train"}


@pytest.mark.exact
def test_segment_streams_are_contiguous_and_split_by_rank():
    tokens = torch.arange(1000)
    whole = segment_stream(tokens, 4, 10)
    # each row continues itself from one segment to the next; targets are the inputs shifted by one
    first, second = whole.segment(0), whole.segment(1)
    assert torch.equal(second[0][:, 0], first[0][:, -1] + 1)
    assert torch.equal(first[1], first[0] + 1)
    # the rows of two ranks are exactly the rows of the one-process stream
    ranks = [segment_stream(tokens, 4, 10, rank=r, world_size=2) for r in range(2)]
    assert torch.equal(torch.cat([r.rows for r in ranks]), whole.rows)
    for step in (0, 5, whole.num_segments - 1, whole.num_segments):
        assert torch.equal(torch.cat([r.segment(step)[0] for r in ranks]), whole.segment(step)[0])
    # rows are contiguous pieces of the corpus in order, len(tokens) // rows long, as the originals batchify
    assert torch.equal(whole.rows[:, 0], torch.arange(4) * 250)
    assert torch.equal(whole.rows[2], tokens[500:750])


def _ordered_iterator_batches(data: torch.Tensor, bsz: int, bptt: int):
    """kimiyoung/transformer-xl pytorch/data_utils.py `LMOrderedIterator(data, bsz, bptt)` (ext_len 0), written out
    from its code: (data, target) of each batch of one epoch, batch-first."""
    n_step = data.size(0) // bsz
    columns = data.narrow(0, 0, n_step * bsz).view(bsz, -1).t()
    for i in range(0, columns.size(0) - 1, bptt):
        seq_len = min(bptt, columns.size(0) - 1 - i)
        yield columns[i : i + seq_len].t(), columns[i + 1 : i + 1 + seq_len].t()


@pytest.mark.exact
@pytest.mark.parametrize("length, rows, seg_len", [(1000, 4, 10), (1003, 3, 7), (97, 2, 48), (50, 5, 100)])
def test_the_transformer_xl_order_gives_the_original_iterators_batches_epoch_after_epoch(length, rows, seg_len):
    tokens = torch.randperm(length)
    stream = segment_stream(tokens, rows, seg_len)
    epoch = list(_ordered_iterator_batches(tokens, rows, seg_len))
    assert stream.num_segments == len(epoch)
    for step in range(3 * len(epoch)):  # train.py starts each epoch at the rows' start, with an empty memory
        inputs, targets = stream.segment(step)
        expected_inputs, expected_targets = epoch[step % len(epoch)]
        assert torch.equal(inputs, expected_inputs) and torch.equal(targets, expected_targets)
        assert stream.plan(step).fresh_memory == (step % len(epoch) == 0)
    evaluated = list(stream)  # evaluation reads one epoch, the last (shorter) segment included
    assert len(evaluated) == len(epoch)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(evaluated, epoch))


@pytest.mark.exact
@pytest.mark.parametrize("length, rows, seg_len", [(1000, 4, 10), (1003, 3, 7), (130, 2, 20)])
def test_the_adaptive_span_order_gives_the_original_trainers_blocks(length, rows, seg_len):
    """facebookresearch/adaptive-span data.py `_batchify` and trainer.py `train_iteration` / `full_eval`, written out
    from their code, with the module `random` seeded as the stream's seed."""
    import random

    tokens = torch.randperm(length)
    data = tokens.narrow(0, 0, (length // rows) * rows).view(rows, -1)
    stream = segment_stream(tokens, rows, seg_len, order="adaptive-span", seed=5)
    random.seed(5)
    train_pos, fresh = 0, True
    for step in range(4 * stream.num_segments + 3):
        inputs, targets = stream.segment(step)
        assert torch.equal(inputs, data[:, train_pos : train_pos + seg_len])
        assert torch.equal(targets, data[:, train_pos + 1 : train_pos + seg_len + 1])
        assert stream.plan(step).fresh_memory == fresh
        train_pos, fresh = train_pos + seg_len, False
        if train_pos >= data.size(1) - seg_len:
            train_pos, fresh = random.randrange(seg_len), True
    blocks, train_pos = [], 0  # full_eval: whole blocks from the start, the rest skipped
    for _ in range(math.ceil(data.size(1) / seg_len)):
        blocks.append(data[:, train_pos : train_pos + seg_len])
        train_pos += seg_len
        if train_pos >= data.size(1) - seg_len:
            break
    evaluated = [inputs for inputs, _ in stream]
    assert len(evaluated) == len(blocks) and all(torch.equal(a, b) for a, b in zip(evaluated, blocks))


def test_a_stream_too_short_for_its_rows_is_refused_with_the_sizes():
    with pytest.raises(DataError, match="too short: 7 tokens cut into 4 rows of 1"):
        segment_stream(torch.arange(7), 4, 10, name="the training text")
    with pytest.raises(DataError, match="rows of 10, but one segment needs 11 tokens a row"):
        segment_stream(torch.arange(40), 4, 10, order="adaptive-span")
    with pytest.raises(DataError, match="data order must be one of transformer-xl, adaptive-span, got 'shuffled'"):
        segment_stream(torch.arange(40), 4, 10, order="shuffled")


def test_char_tokenizer_round_trip_and_unknown_characters(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = build_char_tokenizer("abc de\nf\t")
    text = "bad cafe\n\tfed"
    assert tokenizer.decode(encode(tokenizer, text).tolist()) == text
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded("z a")["input_ids"] == [
        reloaded.unk_token_id,
        tokenizer.convert_tokens_to_ids(" "),
        tokenizer.convert_tokens_to_ids("a"),
    ]


def test_embedded_corpus_and_text_sources(tmp_path):
    corpus = default_corpus()
    assert len(corpus) > 500_000 and corpus.isascii()
    (tmp_path / "a.txt").write_text("first file\n")
    (tmp_path / "b.txt").write_text("second file\n")
    assert load_text(tmp_path / "a.txt").startswith("first file")
    both = load_text(tmp_path)
    assert both.index("first") < both.index("second")
    import datasets

    datasets.Dataset.from_dict({"text": ["one line", "another"]}).save_to_disk(str(tmp_path / "ds"))
    assert load_text(tmp_path / "ds") == "one line\nanother\n"  # each row a line


def test_gradient_accumulation_matches_the_whole_batch(tmp_path):
    whole = train(TrainArgs(output_dir=str(tmp_path / "whole"), max_steps=4, dropout=0.0, save_model=False, **TINY))
    accum = train(
        TrainArgs(output_dir=str(tmp_path / "accum"), max_steps=4, dropout=0.0, grad_accum=2, save_model=False, **TINY)
    )
    a, b = _losses(tmp_path / "whole"), _losses(tmp_path / "accum")
    assert list(a) == [1, 2, 3, 4]
    for step in a:
        assert a[step] == pytest.approx(b[step], abs=1e-5)
    assert a[4] < a[1]  # it learns
    assert whole["eval"][-1]["bpc"] == pytest.approx(accum["eval"][-1]["bpc"], abs=1e-4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_in_one_process(output_dir, flags):
    one = subprocess.run(
        [sys.executable, "-m", "hf_txvariants.cli", "train", "--output-dir", str(output_dir)] + flags,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-3000:]


@pytest.mark.slow
def test_two_gloo_processes_give_the_loss_curve_of_one(tmp_path):
    flags = TINY_FLAGS + ["--max-steps", "6", "--dropout", "0", "--save-every", "3"]
    _train_in_one_process(tmp_path / "one", flags)
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(_free_port()),
            "-m",
            "hf_txvariants.cli",
            "train",
            "--output-dir",
            str(tmp_path / "two"),
        ]
        + flags,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    state = json.loads((tmp_path / "two" / "checkpoints" / "step-6" / "run_state.json").read_text())
    assert state["world_size"] == 2  # really two processes, each with its own memory file
    assert {p.name for p in (tmp_path / "two" / "checkpoints" / "step-6").glob("memory_rank*.pt")} == {
        "memory_rank0.pt",
        "memory_rank1.pt",
    }
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert list(a) == list(b) == list(range(1, 7))
    for step in a:
        assert a[step] == pytest.approx(b[step], abs=1e-5), (step, a, b)
    assert a[6] < a[1]
    valid = lambda folder: [m["valid_bpc"] for m in read_metrics(folder) if m["split"] == "valid"]  # noqa: E731
    assert valid(tmp_path / "one") == pytest.approx(valid(tmp_path / "two"), abs=1e-4)


@pytest.mark.slow
def test_killed_and_resumed_run_gives_the_same_losses(tmp_path):
    flags = TINY_FLAGS + ["--max-steps", "8", "--dropout", "0.1", "--save-every", "3"]
    reference = tmp_path / "reference"
    assert main(["train", "--output-dir", str(reference)] + flags) == 0
    killed = tmp_path / "killed"
    # dies (SIGKILL) after step 5; the last checkpoint is step 3
    run = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, "5", "--output-dir", str(killed)] + flags,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == -9, run.stderr[-2000:]
    assert max(_losses(killed)) == 5 and not (killed / "model").exists()
    assert main(["train", "--output-dir", str(killed), "--resume", "latest"] + flags) == 0
    a, b = _losses(reference), _losses(killed)
    assert list(b) == list(range(1, 9))  # the killed run's steps 4-5 were replaced by the resumed ones
    for step in a:
        assert a[step] == pytest.approx(b[step], abs=1e-6), (step, a, b)
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(reference / "model")
    resumed_model = AutoModelForCausalLM.from_pretrained(killed / "model")
    for (name, p), q in zip(ref_model.named_parameters(), resumed_model.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


def _error_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("txv: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_input_gives_one_clear_line(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("too short")
    err = _error_line(capsys, ["train", "--output-dir", str(tmp_path / "a"), "--data", str(short)] + TINY_FLAGS)
    assert "too short" in err and "segment" in err
    err = _error_line(
        capsys, ["train", "--output-dir", str(tmp_path / "b"), "--data", str(tmp_path / "nope.txt")] + TINY_FLAGS
    )
    assert "not found" in err and "nope.txt" in err
    err = _error_line(capsys, ["train", "--output-dir", str(tmp_path / "c"), "--variant", "transfo-xxl"] + TINY_FLAGS)
    assert "unknown variant 'transfo-xxl'" in err and "transfo-xl" in err
    err = _error_line(capsys, ["eval", "--model", str(tmp_path / "missing-model")])
    assert "missing-model" in err
    err = _error_line(capsys, ["train", "--output-dir", str(tmp_path / "d"), "--resume", "latest"] + TINY_FLAGS)
    assert "no checkpoint" in err


def test_resume_with_a_different_config_is_refused(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--output-dir", out, "--max-steps", "2", "--no-save-model"] + TINY_FLAGS) == 0
    flags = list(TINY_FLAGS)
    flags[flags.index("--n-layer") + 1] = "3"
    err = _error_line(capsys, ["train", "--output-dir", out, "--max-steps", "4", "--resume", "latest"] + flags)
    assert "cannot resume" in err and "--n-layer 2 in the checkpoint, 3 now" in err
    flags = list(TINY_FLAGS)
    flags[flags.index("--seg-len") + 1] = "8"
    err = _error_line(capsys, ["train", "--output-dir", out, "--max-steps", "4", "--resume", "latest"] + flags)
    assert "cannot resume" in err and "--seg-len 16 in the checkpoint, 8 now" in err


@pytest.mark.parametrize("variant", ["transfo-xl", "txv_gtrxl", "txv_adaptive_span", "txv_vanilla"])
def test_causal_variants_plug_into_the_loop(variant):
    from hf_txvariants.training import build_config, build_model, lm_forward, uses_memory, variant_names
    from hf_txvariants.training.models import init_memory

    if variant not in variant_names():
        pytest.skip(f"{variant} is not registered in this checkout")
    torch.manual_seed(0)
    model = build_model(build_config(variant, 40, d_model=32, n_layer=2, n_head=2, mem_len=8, seg_len=16, dropout=0.0))
    stream = segment_stream(torch.randint(0, 40, (200,)), 2, 16)
    memory = init_memory(model, 2)
    assert uses_memory(model) == (memory is not None) == (getattr(model.config, "mem_len", 0) > 0)
    for step in range(2):
        loss, memory = lm_forward(model, *stream.segment(step), memory)
        loss.backward()
        assert torch.isfinite(loss)
        if uses_memory(model):
            assert memory.memory_length == 8  # carried into the next segment


@pytest.mark.parametrize(
    "variant, extra",
    [
        ("transfo-xl", {"cutoffs": [10, 20], "div_val": 2}),
        ("txv_gtrxl", {"adaptive": True, "cutoffs": [10, 20]}),
    ],
)
def test_adaptive_softmax_loss_of_the_loop_never_makes_full_log_probabilities(variant, extra):
    """With an adaptive softmax, `lm_forward` takes the model's per-target loss (each target's cluster only): it
    equals the cross-entropy of the full log-probabilities (the loop's old formula) for both reductions and the
    gradients agree, and `log_probs` (the `[tokens, vocabulary]` tensor) is never called."""
    from hf_txvariants.training import build_config, build_model, lm_forward
    from hf_txvariants.training.models import init_memory

    torch.manual_seed(0)
    model = build_model(
        build_config(variant, 40, d_model=32, n_layer=2, n_head=2, mem_len=8, seg_len=16, dropout=0.0, **extra)
    )
    stream = segment_stream(torch.randint(0, 40, (200,)), 2, 16)
    inputs, targets = stream.segment(0)

    def memory():  # the same memory for every call (a call with use_cache updates the one it is given)
        with torch.no_grad():
            return output_cache(
                model(input_ids=stream.segment(1)[0], use_cache=True, return_logits=False, cache=init_memory(model, 2))
            )

    log_probs = model(input_ids=inputs, cache=memory(), use_cache=True).logits
    expected = torch.nn.functional.cross_entropy(log_probs.reshape(-1, 40), targets.reshape(-1), reduction="sum")
    (expected_gradient,) = torch.autograd.grad(expected, model.crit.out_layers[0].weight)

    def fail(*args, **kwargs):
        raise AssertionError("the full log-probabilities were computed")

    model.crit.log_probs = fail
    for reduction, scale in (("sum", 1.0), ("mean", targets.numel())):
        loss, _ = lm_forward(model, inputs, targets, memory(), reduction=reduction)
        torch.testing.assert_close(loss * scale, expected, atol=1e-4, rtol=1e-5)
    (gradient,) = torch.autograd.grad(
        lm_forward(model, inputs, targets, memory(), "sum")[0], model.crit.out_layers[0].weight
    )
    torch.testing.assert_close(gradient, expected_gradient, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant, extra", [("transfo-xl", {"cutoffs": [10, 20]}), ("txv_shaw", {})])
def test_loop_loss_refuses_targets_of_another_shape_naming_them(variant, extra):
    from hf_txvariants.training import build_config, build_model, lm_forward

    model = build_model(build_config(variant, 40, d_model=32, n_layer=2, n_head=2, mem_len=8, seg_len=16, **extra))
    inputs = torch.randint(0, 40, (2, 16))
    with pytest.raises(ValueError, match=r"targets must have the shape of inputs \(2, 16\), got \(2, 5\)"):
        lm_forward(model, inputs, inputs[:, :5])
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum'"):
        lm_forward(model, inputs, inputs, reduction="none")


def _run_with_checkpoints(folder, steps=4, crash_after=None):
    """A run of `steps` steps with checkpoints every 2; `crash_after`: the run dies (an exception) after that step."""

    class Crash(Exception):
        pass

    def crash(step):
        if step == crash_after:
            raise Crash

    args = TrainArgs(output_dir=str(folder), max_steps=steps, dropout=0.1, save_every=2, save_model=False, **TINY)
    try:
        train(args, on_step=crash)
    except Crash:
        pass
    return TINY_FLAGS + ["--max-steps", str(steps), "--dropout", "0.1", "--save-every", "2", "--no-save-model"]


def test_resume_falls_back_from_a_torn_checkpoint(tmp_path, capsys, caplog):
    """A torn optimizer.bin in the newest checkpoint: `--resume latest` warns, naming it, and resumes from the one
    before, giving the losses of the run that was never interrupted."""
    reference = tmp_path / "reference"
    _run_with_checkpoints(reference, steps=6)
    crashed = tmp_path / "crashed"
    flags = _run_with_checkpoints(crashed, steps=6, crash_after=5)  # checkpoints at steps 2 and 4
    torn = crashed / "checkpoints" / "step-4" / "optimizer.bin"
    torn.write_bytes(torn.read_bytes()[:200])
    with caplog.at_level("WARNING"):
        assert main(["train", "--output-dir", str(crashed), "--resume", "latest"] + flags) == 0
    assert "skipping checkpoint" in caplog.text and "step-4" in caplog.text and "step-2" in caplog.text
    assert "Removed shared tensor" not in caplog.text  # the tied LM head is dropped quietly before saving
    a, b = _losses(reference), _losses(crashed)
    assert list(b) == list(range(1, 7))
    assert all(a[step] == b[step] for step in a), (a, b)  # bit-exact: steps 3-6 were retrained from step 2
    # asked for by name, a torn checkpoint is an error that names it
    torn_again = crashed / "checkpoints" / "step-2" / "optimizer.bin"
    torn_again.write_bytes(torn_again.read_bytes()[:200])
    err = _error_line(
        capsys, ["train", "--output-dir", str(crashed), "--resume", str(crashed / "checkpoints" / "step-2")] + flags
    )
    assert "cannot resume from" in err and "step-2" in err and "does not load" in err


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_resume_refuses_an_unsafe_or_torn_rng_state(tmp_path, capsys):
    """Accelerate swallows errors reading random_states_0.pkl; the loop checks it first: a booby-trapped or torn RNG
    state is an error naming the file, and nothing in it runs."""
    import pickle

    run = tmp_path / "run"
    flags = _run_with_checkpoints(run, steps=4, crash_after=3)
    rng = run / "checkpoints" / "step-2" / "random_states_0.pkl"
    good = rng.read_bytes()
    rng.write_bytes(pickle.dumps({"random_state": _Boom()}))
    err = _error_line(capsys, ["train", "--output-dir", str(run), "--resume", "latest"] + flags)
    assert "random_states_0.pkl" in err and "cannot be read safely" in err
    rng.write_bytes(good[: len(good) // 2])
    err = _error_line(capsys, ["train", "--output-dir", str(run), "--resume", "latest"] + flags)
    assert "random_states_0.pkl" in err
    assert max(_losses(run)) == 3  # nothing more was trained


def test_resume_names_a_refused_missing_or_torn_file_and_falls_back(tmp_path, capsys, caplog):
    """Issue 24: a resume uses every file of its checkpoint or says which it could not use. A refused (a pickle
    that would run code: nothing runs), missing or torn file of the newest checkpoint: the warning names the file and
    the run resumes from the checkpoint before; asked for by name, that checkpoint is an error naming the file."""
    import pickle
    import shutil

    original = tmp_path / "original"
    flags = _run_with_checkpoints(original, steps=6, crash_after=5)  # checkpoints at steps 2 and 4
    state = json.loads((original / "checkpoints" / "step-4" / "run_state.json").read_text())
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "memory_rank0.pt"} <= set(state["files"])
    damages = {
        "optimizer.bin": ("refused", lambda path: path.write_bytes(pickle.dumps({"state": _Boom()}))),
        "scheduler.bin": ("missing", lambda path: path.unlink()),
        "memory_rank0.pt": ("refused", lambda path: path.write_bytes(pickle.dumps([_Boom()]))),
        "model.safetensors": ("torn", lambda path: path.write_bytes(path.read_bytes()[:100])),
    }
    for name, (how, damage) in damages.items():
        run = tmp_path / f"{how}-{name}"
        shutil.copytree(original, run)
        damage(run / "checkpoints" / "step-4" / name)
        reason = {"refused": "refused by the weights-only loader", "missing": "is missing", "torn": "cannot be read"}
        err = _error_line(
            capsys, ["train", "--output-dir", str(run), "--resume", str(run / "checkpoints" / "step-4")] + flags
        )
        assert "cannot resume from" in err and "step-4" in err and name in err and reason[how] in err, err
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert main(["train", "--output-dir", str(run), "--resume", "latest"] + flags) == 0
        skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
        assert len(skipped) == 1 and name in skipped[0] and "step-2 instead" in skipped[0], (name, skipped)
        assert reason[how] in skipped[0]
    assert list(_losses(run)) == list(range(1, 7))  # the last run trained steps 3-6 again, from step 2


def test_evaluation_reads_every_token_of_its_rows_once_even_with_a_segment_longer_than_a_row():
    from hf_txvariants.training import build_config, build_model, evaluate_text

    torch.manual_seed(0)
    model = build_model(build_config("transfo-xl", 40, d_model=16, n_layer=1, n_head=2, mem_len=4, dropout=0.0))
    tokens = torch.randint(0, 40, (51,))
    # 2 rows of 25 tokens: 24 predicted in each, whatever the segment length (the last segment is the shorter one)
    for seg_len in (5, 7, 1000):
        assert evaluate_text(model, tokens, batch_size=2, seg_len=seg_len)["tokens"] == 48
