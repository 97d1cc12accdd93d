"""Nothing is lost on a full disk, and two runs never share one folder (issue 32, items 3 and 4).

The disk fills for real: a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored, so a write past it fails with EFBIG)
in this process or in a `txv train` subprocess, and a small tmpfs filled to the brim (ENOSPC; needs root, skipped
elsewhere). Each failure must be one line naming the folder and the cause, leave the previous folder / checkpoint as
it was and loadable, and leave nothing half-written that a later run would pick up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

import hf_txvariants as txv
from hf_txvariants.cli import main
from hf_txvariants.training import read_metrics
from hf_txvariants.training.checkpoints import complete_checkpoints
from hf_txvariants.training.folder_lock import locked_atomic_directory
from tests.tiny_configs import TINY_CONFIGS, TINY_TRAINING_FLAGS, model_class, tiny_config

resource = pytest.importorskip("resource", reason="file-size limits need a POSIX system")

FIXTURES = Path(__file__).parent / "fixtures"
LEGACY_FOLDER = FIXTURES / "transfo_xl_tokenizer" / "wt103_like"
PYTORCH_CHECKPOINT = FIXTURES / "kimiyoung" / "pt_wt103" / "model.pt"
TINY_FLAGS = TINY_TRAINING_FLAGS


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


@contextmanager
def file_size_limit(nbytes: int):
    """No file of this process grows past `nbytes` in the block: a write beyond fails with OSError(EFBIG)."""
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (a real file system that fills up); skipped where it cannot be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(
            "mounting a small tmpfs to fill needs root (CAP_SYS_ADMIN); the file-size-limit tests cover the rest"
        )
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): needs CAP_SYS_ADMIN")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int):
    """Fills `disk` until only about `leave` bytes are free."""
    stats = os.statvfs(disk)
    free = stats.f_bavail * stats.f_frsize
    with open(disk / "filler", "wb") as filler:
        filler.write(b"\0" * max(free - leave, 0))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def error_line(capsys) -> str:
    """The one error line of a failed command (progress bars and the converters' reports may come before it)."""
    err = capsys.readouterr().err
    lines = [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert "Traceback" not in err and len([line for line in lines if "error: " in line]) == 1, err[-3000:]
    return lines[-1]


# ------------------------------------------------------------------------------------------------ save_pretrained
@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_save_pretrained_on_a_full_disk_keeps_the_previous_folder(model_type, tmp_path):
    """Every variant: a second save that runs out of space raises an OSError naming the folder and the cause; the
    folder still holds the first save, whole, and nothing else is left next to it."""
    model = model_class(model_type, "AutoModel")(tiny_config(model_type)).eval()
    first_weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    before = snapshot(folder)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    weights_size = (folder / "model.safetensors").stat().st_size
    with file_size_limit(weights_size // 2), pytest.raises(OSError) as failure:
        model.save_pretrained(folder)
    message = str(failure.value)
    assert str(folder) in message and "File too large" in message, message
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]  # no staging folder, backup or lock left
    reloaded = type(model).from_pretrained(folder)
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, first_weights[name], msg=name)


@pytest.mark.slow  # a subprocess that imports the plugin
def test_a_killed_save_leaves_a_folder_that_is_ignored_and_cleaned_next_time(tmp_path):
    """A process killed (SIGKILL) while saving leaves its staging folder; the folder it was writing is untouched, and
    the next save removes the leftover."""
    folder = tmp_path / "saved"
    script = f"""
import os
from hf_txvariants.txv_files import atomic_directory
with atomic_directory({str(folder)!r}) as staging:
    (staging / "model.safetensors").write_bytes(b"half")
    os.kill(os.getpid(), 9)
"""
    run = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, run.stderr[-2000:]
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert not folder.exists() and any(name.startswith(".saved.txv-") for name in leftovers), leftovers
    model = model_class("txv_gtrxl", "AutoModel")(tiny_config("txv_gtrxl"))
    model.save_pretrained(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    type(model).from_pretrained(folder)


# ------------------------------------------------------------------------------------------------ txv train
# A `txv train` whose file-size limit drops to LIMIT bytes when the loop calls `loop.<NAME>` for the CALL-th time (the
# test's own hook: nothing in the production loop knows about it).
LIMITED_RUN = """
import resource, signal, sys
from hf_txvariants.cli import main
from hf_txvariants.training import loop
name, call, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
original, calls = getattr(loop, name), []
def limited(*args, **kwargs):
    calls.append(1)
    if len(calls) == call:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return original(*args, **kwargs)
setattr(loop, name, limited)
sys.exit(main(["train", *sys.argv[4:]]))
"""


def _limited_train(name: str, call: int, flags: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", LIMITED_RUN, name, str(call), "4096", *flags],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # three `txv train` runs, two in subprocesses
def test_train_on_a_full_disk_keeps_the_last_checkpoint_and_model(tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--save-every", "2"] + TINY_FLAGS
    # the disk fills while the second checkpoint (step 4) is written
    run = _limited_train("save_checkpoint", 2, flags + ["--max-steps", "4"])
    assert run.returncode == 2, run.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]  # no torn step-4, no partial
    last = run.stderr.strip().splitlines()[-1]
    assert last == f"txv: error: could not write {out / 'checkpoints' / 'step-4'} (left as it was): File too large"
    assert complete_checkpoints(out) == [out / "checkpoints" / "step-2"] and not (out / "model").exists()
    assert not (out / ".txv.lock").exists()

    # `--resume latest` takes step 2 (it loads) and finishes the run
    assert main(["train", "--resume", "latest", "--max-steps", "4"] + flags) == 0
    assert [m["step"] for m in read_metrics(out) if m["split"] == "train"] == [1, 2, 3, 4]
    model_files = snapshot(out / "model")

    # the disk fills while the final model of a longer run is written: the previous model/ is kept as it was
    run = _limited_train("locked_atomic_directory", 1, ["--resume", "latest", "--max-steps", "6"] + flags)
    assert run.returncode == 2, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last == f"txv: error: could not write {out / 'model'} (left as it was): File too large"
    assert snapshot(out / "model") == model_files
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no staging folder or lock
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out / "model")


# A `txv train` that stops for good in the middle of writing its second checkpoint (after Accelerate's files, before
# the checkpoint is complete), saying so in READY: the test then starts a second run into the same folder.
STALLED_RUN = """
import sys, time
from pathlib import Path
import accelerate
from hf_txvariants.cli import main
original, calls = accelerate.Accelerator.save_state, []
def stalled(self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    calls.append(1)
    if len(calls) == 2:
        Path(sys.argv[1]).write_text("ready")
        time.sleep(600)
    return result
accelerate.Accelerator.save_state = stalled
sys.exit(main(["train", *sys.argv[2:]]))
"""


@pytest.mark.slow  # `txv train` subprocesses
def test_a_second_run_into_the_same_folder_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    ready = tmp_path / "ready"
    flags = ["--output-dir", str(out), "--save-every", "1", "--max-steps", "3"] + TINY_FLAGS
    first = subprocess.Popen(
        [sys.executable, "-c", STALLED_RUN, str(ready), *flags],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not ready.exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first run never reached its second checkpoint"
            time.sleep(0.2)
        assert main(["train"] + flags) == 2
        err = error_line(capsys)
        assert f"{out} is in use by process {first.pid} on host " in err and "started 20" in err, err
        assert "(txv train)" in err
    finally:
        first.kill()
        first.communicate()
    # the killed run left its lock file and a partial step-2: the next run takes over, cleans, resumes from step 1
    assert (out / ".txv.lock").exists() and (out / "checkpoints" / ".step-2.partial").is_dir()
    assert complete_checkpoints(out) == [out / "checkpoints" / "step-1"]
    assert main(["train", "--resume", "latest"] + flags) == 0
    err = capsys.readouterr().err
    assert f"taking over the lock {out / '.txv.lock'} left by process {first.pid} on host" in err, err
    assert f"removed the partial checkpoint {out / 'checkpoints' / '.step-2.partial'}" in err, err
    assert [m["step"] for m in read_metrics(out) if m["split"] == "train"] == [1, 2, 3]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3"]


# ------------------------------------------------------------------------------------------------ convert, upgrade
def test_convert_on_a_full_disk_keeps_the_previous_output(tmp_path, capsys):
    out = tmp_path / "converted"
    command = [
        "convert",
        "kimiyoung-pytorch",
        "--checkpoint",
        str(PYTORCH_CHECKPOINT),
        "--output",
        str(out),
        "--no-progress",
    ]
    assert main(command) == 0
    before = snapshot(out)
    capsys.readouterr()
    with file_size_limit((out / "model.safetensors").stat().st_size // 2):
        assert main(command + ["--overwrite"]) == 2
    assert error_line(capsys) == f"error: could not write {out} (left as it was): File too large"
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted"]


def test_a_conversion_into_a_folder_being_written_is_refused(tmp_path, capsys):
    out = tmp_path / "converted"
    with locked_atomic_directory(out):
        assert (
            main(
                [
                    "convert",
                    "kimiyoung-pytorch",
                    "--checkpoint",
                    str(PYTORCH_CHECKPOINT),
                    "--output",
                    str(out),
                    "--no-progress",
                ]
            )
            == 2
        )
        err = error_line(capsys)
    assert f"{tmp_path} is in use by process {os.getpid()} on host" in err and f"(writing {out})" in err, err
    assert out.is_dir() and not list(out.iterdir())  # the holder's (empty) result, not the refused conversion's


def test_upgrade_legacy_in_place_on_a_full_disk_keeps_the_original(small_disk, capsys):
    folder = small_disk / "legacy"
    shutil.copytree(LEGACY_FOLDER, folder)
    before = snapshot(folder)
    fill(small_disk, leave=32 * 1024)  # less than the rewritten folder needs
    assert main(["upgrade-legacy", str(folder), "--in-place"]) == 2
    assert error_line(capsys) == f"txv: error: could not write {folder} (left as it was): No space left on device"
    assert snapshot(folder) == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "legacy"]
    (small_disk / "filler").unlink()
    assert main(["upgrade-legacy", str(folder), "--in-place"]) == 0  # with space again it works
    assert (folder / "vocab.json").exists() and not (folder / "vocab.pkl").exists()


def test_train_lock_names_json_holder_fields(tmp_path):
    """The lock file holds what the refusal names (pid, host, start time) while the run holds it."""
    from hf_txvariants.training.folder_lock import folder_lock

    lock = tmp_path / ".txv.lock"
    with folder_lock(lock, "txv train"):
        record = json.loads(lock.read_text())
        assert record["pid"] == os.getpid() and record["holder"] == "txv train" and record["host"]
        assert abs(record["started"] - time.time()) < 60
    assert not lock.exists()


def test_no_shipped_file_holds_a_process_lock():
    """The output-folder lock serves the commands (hf_txvariants.training.folder_lock): the files a Hub folder carries
    (txv_*, configuration_*, modeling_*, tokenization_*) neither define nor import it, nor fcntl."""
    import ast

    shipped = ("txv_", "configuration_", "modeling_", "tokenization_")
    found = []
    for path in sorted(Path(txv.__file__).parent.glob("*.py")):
        if not path.name.startswith(shipped):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [alias.name for alias in node.names]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            else:
                continue
            found += [f"{path.name}: {name}" for name in names if name in ("fcntl", "folder_lock", "FolderInUseError")]
    assert found == []


def test_every_variant_is_covered():
    assert set(TINY_CONFIGS) == set(txv.VARIANTS)


def test_trainer_path_holds_the_same_lock_and_saves_the_model_folder_whole(tmp_path, capsys):
    """`txv train --trainer` is refused into a folder another run holds, and writes model/ as one folder."""
    from hf_txvariants.training.folder_lock import folder_lock

    out = tmp_path / "run"
    out.mkdir()
    command = ["train", "--trainer", "--output-dir", str(out), "--max-steps", "2"] + TINY_FLAGS
    with folder_lock(out / ".txv.lock", "txv train"):
        assert main(command) == 2
    assert f"{out} is in use by process {os.getpid()} on host" in error_line(capsys)
    assert main(command) == 0
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= {p.name for p in (out / "model").iterdir()}
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


# ------------------------------------------------------------------------------------------------ the token cache
def test_the_token_cache_on_a_full_disk_keeps_the_previous_cache(tmp_path):
    """The data changes, so the word-level cache is rebuilt, and the disk fills: first while the new vocabulary is
    written, then (more room) while the training text's word numbers are written (a temporary file, 4 bytes a token,
    larger than the ids). Each time an OSError names the file and the cause and no partial file is left in the cache
    folder; the first time the cache is exactly as before (the old data still maps from it); once there is room the
    rebuild succeeds."""
    from hf_txvariants.training import TrainArgs
    from hf_txvariants.training.token_cache import plan_corpus

    data, cache = tmp_path / "train.txt", tmp_path / "cache"
    old_text = "".join(f"w{i % 97} w{i % 13} w{i % 7}\n" for i in range(4000))
    data.write_text(old_text)
    args = TrainArgs(output_dir=str(tmp_path / "run"), token_cache=str(cache), data=str(data), tokenizer="word")
    first_ids = np.array(plan_corpus(args).prepare().train_ids)
    cache_before = snapshot(cache)

    data.write_text("".join(f"w{i % 89} w{i % 11}\n" for i in range(40000)))  # other data: rebuilt, larger
    with file_size_limit(2_000), pytest.raises(OSError) as failure:
        plan_corpus(args).prepare()
    message = str(failure.value)
    assert message.startswith(f"could not write {cache}") and message.endswith("File too large"), message
    assert snapshot(cache) == cache_before and not list(cache.glob(".*"))  # nothing torn, nothing partial
    data.write_text(old_text)
    assert np.array_equal(np.array(plan_corpus(args).prepare().train_ids), first_ids)  # a hit, as before

    data.write_text("".join(f"w{i % 89} w{i % 11}\n" for i in range(40000)))
    with file_size_limit(100_000), pytest.raises(OSError) as failure:  # the vocabulary fits, the numbers do not
        plan_corpus(args).prepare()
    message = str(failure.value)
    assert message.startswith(f"could not write {cache} (the training text's word numbers, a temporary file)")
    assert message.endswith("File too large"), message
    assert not list(cache.glob(".*"))
    assert len(plan_corpus(args).prepare().train_ids) > len(first_ids)  # rebuilt once there is room


def test_atomic_writes_keep_the_permissions_of_a_plain_write(tmp_path):
    """tempfile makes private (0700 / 0600) staging folders and files; what the atomic helpers put in place has the
    mode a plain mkdir / open would give under the process's umask, so a saved model stays readable by others."""
    from hf_txvariants.txv_files import atomic_directory, atomic_write_bytes

    old_mask = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "folder") as staging:
            (staging / "weights").write_bytes(b"x")
        atomic_write_bytes(tmp_path / "file", b"x")
        (tmp_path / "plain").mkdir()
        (tmp_path / "plain.txt").write_bytes(b"x")
    finally:
        os.umask(old_mask)
    mode = lambda path: path.stat().st_mode & 0o777  # noqa: E731
    assert mode(tmp_path / "folder") == mode(tmp_path / "plain") == 0o755
    assert mode(tmp_path / "file") == mode(tmp_path / "plain.txt") == 0o644
