"""`txv serve`: transformers' own server with the plugin's causal LMs, started on 127.0.0.1 and spoken to with the
`openai` client. Every causal variant answers a completion with what `generate()` called directly gives (greedy, one
torch thread on both sides, so both run the very same operations: compared exactly); a streamed completion is the
same text in pieces; a chat completion follows the tokenizer's chat template; bad requests get an error naming the
problem and the server goes on. What a variant cannot take is refused in one line, naming the variant and the flag.

The server runs in a subprocess with a deadline on every wait, and is always stopped (SIGINT, then SIGKILL)."""

from __future__ import annotations

import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_txvariants as txv
from hf_txvariants.cli import main
from hf_txvariants.cli import serve as txv_serve
from hf_txvariants.training.data import build_char_tokenizer
from tiny_configs import TINY_CONFIGS, model_class, tiny_config

pytest.importorskip("fastapi", reason="txv serve needs the serve extra (pip install 'hf-txvariants[serve]')")
pytest.importorskip("uvicorn", reason="txv serve needs the serve extra")
openai = pytest.importorskip("openai", reason="txv serve needs the serve extra")

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("serve")]

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the quick brown fox jumps over the lazy dog. "
PROMPT = "the lazy dog jumps over"  # longer than Transformer-XL's memory in the tiny config
SMALL_PROMPT = "a bad cafe. a bad egg."  # characters of the first 12 ids only
NEW_TOKENS = 12  # more than that memory too: generation goes on past it
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
CAUSAL_VARIANTS = [name for name in txv.VARIANTS if model_class(name, "AutoModelForCausalLM") is not None]
START_SECONDS = 120  # the deadline for the server to answer /health (imports on a loaded 2-core machine)
REQUEST_SECONDS = 60
STOP_SECONDS = 60


def _save(folder: Path, model_type: str, tokenizer, **overrides) -> Path:
    """A tiny model of `model_type` with `tokenizer`, saved as `txv train` saves one (weights, code, tokenizer)."""
    fields = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": None}
    if "vocab_size" in TINY_CONFIGS[model_type]:
        fields["vocab_size"] = len(tokenizer)
    if TINY_CONFIGS[model_type].get("max_position_embeddings", 64) < 64:  # room for the prompts and completions
        fields["max_position_embeddings"] = 64
    torch.manual_seed(0)
    model = model_class(model_type, "AutoModelForCausalLM")(tiny_config(model_type, **{**fields, **overrides}))
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _image_tokenizer():
    """The Image Transformer's 257 ids (256 intensities and its start token) as characters."""
    return build_char_tokenizer(TEXT + "".join(chr(0x100 + i) for i in range(254 - len(set(TEXT)))))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    tokenizer = build_char_tokenizer(TEXT)
    saved = {}
    for model_type in CAUSAL_VARIANTS:
        own = _image_tokenizer() if model_type == "txv_image_transformer" else tokenizer
        saved[model_type] = str(_save(root / model_type, model_type, own))
    chat_tokenizer = build_char_tokenizer(TEXT + CHAT_TEMPLATE + ":\n")
    chat_tokenizer.chat_template = CHAT_TEMPLATE
    saved["chat"] = str(_save(root / "chat", "txv_vanilla", chat_tokenizer))
    # a vocabulary smaller than the tokenizer's: the characters after "h" have ids past the model's last one
    saved["small vocabulary"] = str(_save(root / "small", "txv_vanilla", tokenizer, vocab_size=12, pad_token_id=0))
    return saved


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """SIGINT (uvicorn shuts down cleanly and transformers unloads the models), then SIGKILL past the deadline."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_SECONDS)


@contextmanager
def running_server(log: Path, *flags: str):
    """`txv serve` in a subprocess (one torch thread, as the direct generate() of the comparisons): yields
    (process, base URL) once /health answers; SIGINT then SIGKILL at the end."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "hf_txvariants.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as output:
        process = subprocess.Popen(
            command + ["--device", "cpu", *flags], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"txv serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"txv serve did not answer /health within {START_SECONDS}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield process, url
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`txv serve` without a model: each request's model is loaded on demand. Yields the base URL."""
    with running_server(tmp_path_factory.mktemp("serve-log") / "server.log") as (_, url):
        yield url


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=REQUEST_SECONDS, max_retries=0) as client:
        yield client


def _generate(folder: str, prompt_ids: torch.Tensor, new_tokens: int) -> str:
    """What `generate()` called directly continues `prompt_ids` with (greedy), decoded as the server decodes."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        ids = model.generate(
            prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False, max_new_tokens=new_tokens
        )
    return tokenizer.decode(ids[0, prompt_ids.shape[1] :], skip_special_tokens=True)


def _direct_completion(folder: str, prompt: str, new_tokens: int) -> str:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return _generate(folder, tokenizer(prompt, return_tensors="pt")["input_ids"], new_tokens)


def _serves(client, folder: str, prompt: str = PROMPT) -> bool:
    answer = client.completions.create(model=folder, prompt=prompt, max_tokens=3, temperature=0)
    return answer.usage.completion_tokens == 3


@pytest.mark.slow
@pytest.mark.parametrize("model_type", CAUSAL_VARIANTS)
def test_every_causal_variant_completes_as_generate_does(client, folders, model_type):
    folder = folders[model_type]
    answer = client.completions.create(model=folder, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0)
    choice = answer.choices[0]
    assert choice.text == _direct_completion(folder, PROMPT, NEW_TOKENS)
    assert choice.finish_reason == "length" and answer.usage.completion_tokens == NEW_TOKENS
    assert answer.usage.prompt_tokens == len(PROMPT)  # one character, one token: nothing was cut


@pytest.mark.slow
def test_transformer_xl_past_its_memory_length_answers_as_generate_does(client, folders):
    """A prompt, and a completion, longer than mem_len: the server runs generate() on the whole prompt (nothing cut to
    the memory's window), which carries the model's MemoryCache from the prompt on, one token per step against it
    (what that memory holds is tested in tests/test_generation_step.py; random weights cannot show it in text)."""
    folder = folders["transfo-xl"]
    config = AutoModelForCausalLM.from_pretrained(folder).config
    prompt = PROMPT * 2
    assert config.mem_len < len(prompt) and config.mem_len < 2 * NEW_TOKENS
    answer = client.completions.create(model=folder, prompt=prompt, max_tokens=2 * NEW_TOKENS, temperature=0)
    assert answer.choices[0].text == _direct_completion(folder, prompt, 2 * NEW_TOKENS)
    assert answer.usage.prompt_tokens == len(prompt)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["transfo-xl", "txv_vanilla"])
def test_a_streamed_completion_is_the_completion_in_pieces(client, folders, model_type):
    folder = folders[model_type]
    stream = client.completions.create(model=folder, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, stream=True)
    chunks = list(stream)
    pieces = [chunk.choices[0].text for chunk in chunks]
    assert len([piece for piece in pieces if piece]) > 1
    assert "".join(pieces) == _direct_completion(folder, PROMPT, NEW_TOKENS)
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.slow
def test_a_chat_completion_follows_the_tokenizers_chat_template(client, folders):
    folder = folders["chat"]
    messages = [{"role": "user", "content": "the quick brown fox"}]
    answer = client.chat.completions.create(model=folder, messages=messages, max_tokens=NEW_TOKENS, temperature=0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt_ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    assert answer.choices[0].message.content == _generate(folder, prompt_ids, NEW_TOKENS)
    assert answer.usage.prompt_tokens == prompt_ids.shape[1]


@pytest.mark.slow
def test_a_chat_completion_with_a_logit_bias_takes_it(client, folders):
    """A chat request's logit_bias is transformers' sequence_bias: -100 on every id but one leaves that one."""
    folder = folders["chat"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    keep = tokenizer.convert_tokens_to_ids("e")
    bias = {str(i): -100 for i in range(len(tokenizer)) if i != keep}
    messages = [{"role": "user", "content": "the quick brown fox"}]
    answer = client.chat.completions.create(
        model=folder, messages=messages, max_tokens=4, temperature=0, logit_bias=bias
    )
    assert answer.choices[0].message.content == "eeee"


@pytest.mark.slow
def test_bad_requests_get_a_clear_error_and_the_server_goes_on(client, folders, tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model=missing, prompt=PROMPT, max_tokens=3)
    assert error.value.body["message"].startswith(f"{missing}: ")
    assert _serves(client, folders["txv_vanilla"])

    # "t" has an id past the last of the model's 12: the model's own input check answers, naming the field
    small = folders["small vocabulary"]
    assert _serves(client, small, SMALL_PROMPT)  # ids inside the vocabulary
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=small, prompt="the lazy", max_tokens=3)
    assert "input_ids must be in [0, 12) (config.vocab_size)" in error.value.body["message"]
    with pytest.raises(openai.APIError) as error:  # streamed: the error comes as the stream's event
        list(client.completions.create(model=small, prompt="the lazy", max_tokens=3, stream=True))
    assert "input_ids must be in [0, 12)" in str(error.value.body)
    assert _serves(client, small, SMALL_PROMPT)

    # a prompt of token ids: the server takes text prompts only, and says so
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=small, prompt=[1, 2, 99], max_tokens=3)
    assert error.value.body["message"].startswith("prompt: [1, 2, 99] is not a string (one text prompt per request")
    assert error.value.body["param"] == "prompt"

    # a chat request to a tokenizer without a chat template
    with pytest.raises(openai.BadRequestError, match="chat_template is not set"):
        client.chat.completions.create(model=small, messages=[{"role": "user", "content": "the"}], max_tokens=3)
    assert _serves(client, small, SMALL_PROMPT) and _serves(client, folders["chat"])


# --------------------------------------------------------------------------------------------------------------------
# refused options (no server is started: the model given on the command line is checked first)
REFUSED = {
    "--continuous-batching": [],
    "--cb-block-size": ["16"],
    "--compile": [],
    "--quantization": ["bnb-8bit"],
    "--attn-implementation": ["flash_attention_2"],
}


@pytest.mark.parametrize("option", REFUSED)
def test_an_option_a_variant_cannot_take_is_refused_in_one_line(folders, capsys, option):
    folder = folders["transfo-xl"]
    assert main(["serve", folder, "--device", "cpu", option, *REFUSED[option]]) == 2
    error = capsys.readouterr().err.strip()
    given = " ".join([option, *REFUSED[option]])
    assert error.startswith(f"txv: error: {folder}: transfo-xl (TransfoXLLMHeadModel) cannot take {given}: ")
    assert len(error.splitlines()) == 1


def test_an_attention_implementation_the_class_lacks_is_refused(folders, capsys):
    folder = folders["txv_reformer"]
    assert main(["serve", folder, "--device", "cpu", "--attn-implementation", "sdpa"]) == 2
    assert "txv_reformer (TxvReformerForCausalLM) cannot take --attn-implementation sdpa: it takes eager" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("model_type", CAUSAL_VARIANTS)
def test_what_the_help_says_is_refused_for_every_variant_is(model_type):
    cls = model_class(model_type, "AutoModelForCausalLM")
    for option, value in [("--continuous-batching", True), ("--compile", True), ("--quantization", "bnb-4bit")]:
        assert txv_serve.refusal(cls, option, value) is not None
    for implementation in ["flash_attention_2", "flash_attention_3", "kernels-community/flash-attn2"]:
        assert txv_serve.refusal(cls, "--attn-implementation", implementation) is not None
    flex = txv_serve.refusal(cls, "--attn-implementation", "flex_attention")
    # the XL family's relative attention through FlexAttention (txv_relative_attention); no other variant's
    assert (flex is None) == (model_type in ("transfo-xl", "txv_gtrxl", "txv_adaptive_span"))
    assert txv_serve.refusal(cls, "--attn-implementation", "eager") is None


def test_a_model_named_by_a_request_is_refused_as_at_start(folders):
    folder = folders["txv_universal"]
    with pytest.raises(ValueError, match=f"^{folder}: txv_universal .* cannot take --compile: "):
        _load(folder, options={"--compile": True})


def test_a_classifier_folder_is_refused_as_not_a_causal_lm(tmp_path, capsys):
    tokenizer = build_char_tokenizer(TEXT)
    config = tiny_config("txv_vanilla", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    model_class("txv_vanilla", "AutoModelForSequenceClassification")(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert main(["serve", str(tmp_path), "--device", "cpu"]) == 2
    assert "holds a VanillaForSequenceClassification, not a causal LM" in capsys.readouterr().err


def _unregistered_copy(folder: str, target: Path) -> str:
    """The folder as a later plugin might save a new variant: a model type this plugin does not register, with the
    code the folder carries."""
    shutil.copytree(folder, target)
    for name in ("config.json", "configuration_vanilla.py"):
        path = target / name
        path.write_text(path.read_text().replace("txv_vanilla", "txv_vanilla_next"))
    return str(target)


def _load(folder: str, trust_remote_code: bool = False, options: dict | None = None, gguf_file: str | None = None):
    """The model class and whether the vocabulary sizes match, as the server's model manager loads `folder` for a
    request (with the refusable `options` of the command line)."""
    manager_class = type("Manager", (txv_serve.model_manager_class(),), {"requested_options": options or {}})
    manager = manager_class(device="cpu", trust_remote_code=trust_remote_code, model_timeout=-1)
    try:
        name = manager.process_model_name(folder)  # as requests name it
        model, tokenizer = manager.load_model_and_processor(name, gguf_file=gguf_file)
        return type(model), len(tokenizer) == model.config.vocab_size
    finally:
        manager.shutdown()


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_a_variant_loads_with_the_plugins_code(folders, trust_remote_code):
    # transformers prefers a registered class to the folder's code, with or without trust_remote_code
    model_type, vocabulary_matches = _load(folders["txv_gtrxl"], trust_remote_code)
    assert model_type is txv.GTrXLForCausalLM and vocabulary_matches


def test_a_model_type_not_registered_here_loads_the_folders_code_with_trust_remote_code(folders, tmp_path):
    folder = _unregistered_copy(folders["txv_vanilla"], tmp_path / "next")
    with pytest.raises(ValueError, match="not registered here; --trust-remote-code runs the code it carries"):
        _load(folder, trust_remote_code=False)
    model_type, vocabulary_matches = _load(folder, trust_remote_code=True)
    assert model_type.__module__.startswith("transformers_modules.") and model_type.__name__ == "VanillaForCausalLM"
    assert vocabulary_matches


def test_txv_serve_has_every_flag_of_transformers_serve_with_its_default():
    from transformers.cli.serve import Serve

    parser = txv_serve.add_arguments
    import argparse

    built = argparse.ArgumentParser()
    parser(built)
    defaults = {action.dest: action.default for action in built._actions}
    parameters = dict(inspect.signature(Serve.__init__).parameters)
    for name in ("self", "force_model", "non_blocking"):  # MODEL, and transformers' switch for its own tests
        parameters.pop(name)
    assert set(parameters) == set(txv_serve.SERVE_ARGUMENTS)
    for name, parameter in parameters.items():
        expected = getattr(parameter.default, "value", parameter.default)  # the reasoning mode is an enum
        assert defaults[name] == expected, name
    assert all(action.help for action in built._actions)


def test_without_the_serving_dependencies_the_command_says_which_extra_to_install(monkeypatch, capsys):
    monkeypatch.setattr(txv_serve, "SERVE_MODULES", (*txv_serve.SERVE_MODULES, "no_such_module_txv"))
    assert main(["serve", "--port", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        "txv: error: txv serve needs transformers' serving dependencies (no_such_module_txv missing): "
        "pip install 'hf-txvariants[serve]'"
    )
