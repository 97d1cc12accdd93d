"""`txv serve` that no single request can hold, and that batches the requests it is given (issue 52):

* limits a server owner sets (new tokens, prompt length, body size, time), each refused above it with a 400 naming the
  field, the value and the limit, and listed with its default by `txv serve --help`;
* a request that is gone stops costing anything: a client that disconnects (streamed or not) or runs past its time
  ends its generation within a token, and the next request is served at once; SIGINT / SIGTERM stop a server that is
  generating within seconds;
* every field a variant cannot honour, or a value out of its range, is refused in one line (the table of
  hf_txvariants/cli/serve_requests.py, checked against the installed `openai` request types);
* concurrent requests are generated in one batch, each row's text what the request gets alone (greedy), a sampled
  request with a seed the same text whatever runs beside it.

Servers run in subprocesses on 127.0.0.1 with a deadline on every wait, and are always stopped."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from hf_txvariants.cli import main, serve_requests
from hf_txvariants.training.data import build_char_tokenizer
from test_serve import TEXT, _direct_completion, _save, running_server

pytest.importorskip("fastapi", reason="txv serve needs the serve extra (pip install 'hf-txvariants[serve]')")
pytest.importorskip("uvicorn", reason="txv serve needs the serve extra")
openai = pytest.importorskip("openai", reason="txv serve needs the serve extra")

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("serve")]

ROOT = Path(__file__).resolve().parents[1]
STOP_SECONDS = 15  # SIGINT / SIGTERM to exit, on a loaded 2-core machine (interpreter teardown alone takes ~3 s)
LIMITS = {"--max-new-tokens": 100000, "--max-prompt-tokens": 100, "--max-body-bytes": 20000}
TIME_LIMIT = 10  # --request-timeout of the guarded server: every ordinary request here takes well under a second
LONG = 90000  # new tokens that take a tiny Transformer-XL minutes (no position limit: its positions are relative)
SERVED_AT_ONCE = 5.0  # seconds an ordinary request may take right after a long one was dropped


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-limits")
    tokenizer = build_char_tokenizer(TEXT)
    return {
        name: str(_save(root / name, name, tokenizer))
        for name in ("transfo-xl", "txv_vanilla", "txv_sparse_transformer")
    } | {"small vocabulary": str(_save(root / "small", "txv_vanilla", tokenizer, vocab_size=12, pad_token_id=0))}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, folders):
    """A server with small limits, every model loaded once (a request's time counts its model's loading)."""
    log = tmp_path_factory.mktemp("serve-limits-log") / "server.log"
    flags = [str(part) for pair in LIMITS.items() for part in pair]
    with running_server(log, *flags, "--request-timeout", str(TIME_LIMIT), "--log-level", "info") as (_, url):
        for folder in folders.values():
            post(url, "/v1/completions", {"model": folder, "prompt": "abc", "max_tokens": 1, "temperature": 0})
        yield url, log


def post(url: str, path: str, body, timeout: float = 60) -> tuple[int, dict]:
    """POST `body` (a dict, or the JSON text itself: NaN cannot be sent otherwise); (status, JSON answer)."""
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def complete(url: str, folder: str, prompt: str, new_tokens: int, **fields) -> str:
    status, answer = post(
        url, "/v1/completions", {"model": folder, "prompt": prompt, "max_tokens": new_tokens, **fields}
    )
    assert status == 200, answer
    return answer["choices"][0]["text"]


def timed_ordinary_request(url: str, folder: str) -> float:
    start = time.monotonic()
    complete(url, folder, "the lazy dog", 4, temperature=0)
    return time.monotonic() - start


# ------------------------------------------------------------------------------------------------------------------
# 1. limits
def test_the_help_lists_each_limit_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    text = text[text.index("limits (txv serve's own") :]  # the group, after the usage line
    for flag, default in [
        ("--max-new-tokens", 1024),
        ("--max-prompt-tokens", 4096),
        ("--max-body-bytes", 1048576),
        ("--request-timeout", 120.0),
        ("--max-batch-size", 8),
    ]:
        start = text.index(f"{flag} ")
        end = text.find(" --", start + len(flag))
        assert f"(default: {default})" in text[start : end if end > 0 else None], flag


@pytest.mark.slow
def test_a_request_over_a_limit_is_refused_naming_the_field_the_value_and_the_limit(guarded, folders):
    url, _ = guarded
    folder = folders["transfo-xl"]
    status, answer = post(url, "/v1/completions", {"model": folder, "prompt": "the", "max_tokens": 10**12})
    assert status == 400 and answer["error"]["param"] == "max_tokens"
    assert answer["error"]["message"] == "max_tokens: 1000000000000, over the limit of 100000 (--max-new-tokens)"
    chat = {"model": folder, "messages": [{"role": "user", "content": "the"}], "max_completion_tokens": 100001}
    status, answer = post(url, "/v1/chat/completions", chat)
    assert status == 400
    assert answer["error"]["message"] == "max_completion_tokens: 100001, over the limit of 100000 (--max-new-tokens)"

    # the prompt, counted in tokens (one character, one token here); the model's own limits are not reached
    status, answer = post(url, "/v1/completions", {"model": folder, "prompt": "a" * 101, "max_tokens": 2})
    assert status == 400
    assert answer["error"]["message"] == "prompt: 101 tokens, over the limit of 100 (--max-prompt-tokens)"
    assert complete(url, folder, "a" * 100, 2, temperature=0)  # at the limit: served

    # the body, before anything is parsed
    status, answer = post(url, "/v1/completions", {"model": folder, "prompt": "a", "user": "x" * 20000})
    assert status == 400 and answer["error"]["param"] == "body"
    assert answer["error"]["message"].endswith("bytes, over the limit of 20000 (--max-body-bytes)")
    assert timed_ordinary_request(url, folder) < SERVED_AT_ONCE


@pytest.mark.slow
def test_a_request_that_names_no_length_gets_the_limit_at_most(tmp_path, folders):
    with running_server(tmp_path / "log", folders["transfo-xl"], "--max-new-tokens", "7") as (_, url):
        status, answer = post(url, "/v1/completions", {"prompt": "the lazy", "temperature": 0})
        assert status == 200 and answer["usage"]["completion_tokens"] == 7


# ------------------------------------------------------------------------------------------------------------------
# 2. a request that is gone stops costing anything
@pytest.mark.slow
def test_a_client_that_disconnects_ends_its_generation(guarded, folders):
    url, _ = guarded
    folder = folders["transfo-xl"]
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": folder, "prompt": "the lazy dog", "max_tokens": LONG, "temperature": 0})
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
    time.sleep(1.0)  # generating by now
    connection.close()  # the client gives up without reading
    time.sleep(1.0)  # the generation ends within a token of the disconnect
    assert timed_ordinary_request(url, folder) < SERVED_AT_ONCE

    # a stream dropped mid-way
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30, max_retries=0) as client:
        stream = client.completions.create(model=folder, prompt="the lazy", max_tokens=LONG, temperature=0, stream=True)
        assert len(list(itertools.islice(stream, 3))) == 3
        stream.close()
    time.sleep(1.0)
    assert timed_ordinary_request(url, folder) < SERVED_AT_ONCE


@pytest.mark.slow
def test_a_request_past_its_time_limit_ends_with_a_408_naming_it(guarded, folders):
    url, _ = guarded
    folder = folders["transfo-xl"]
    start = time.monotonic()
    status, answer = post(url, "/v1/completions", {"model": folder, "prompt": "the", "max_tokens": LONG})
    took = time.monotonic() - start
    assert status == 408 and answer["error"]["type"] == "request_timeout"
    assert answer["error"]["message"].startswith(f"the request ran past its time limit of {TIME_LIMIT} s")
    assert TIME_LIMIT <= took < TIME_LIMIT + 5
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0) as client:
        with pytest.raises(openai.APIError) as error:  # the stream's error event
            list(client.completions.create(model=folder, prompt="the", max_tokens=LONG, stream=True))
        assert "time limit" in str(error.value.body)
    assert timed_ordinary_request(url, folder) < SERVED_AT_ONCE


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_generating_server_within_seconds(tmp_path, folders, stop_signal):
    folder = folders["transfo-xl"]
    with running_server(tmp_path / "log", folder, "--max-new-tokens", str(LONG)) as (process, url):
        answers = {}

        def long_request():
            try:
                answers["plain"] = post(url, "/v1/completions", {"prompt": "the lazy", "max_tokens": LONG}, 60)
            except OSError as error:  # the connection closed: also an end
                answers["plain"] = error

        def long_stream(started: threading.Event):
            with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0) as client:
                try:
                    for _ in client.completions.create(prompt="the", model=folder, max_tokens=LONG, stream=True):
                        started.set()
                    answers["stream"] = "closed"
                except (openai.APIError, OSError) as error:
                    answers["stream"] = error

        started = threading.Event()
        threads = [threading.Thread(target=long_request), threading.Thread(target=long_stream, args=(started,))]
        for thread in threads:
            thread.start()
        assert started.wait(30)
        time.sleep(0.5)
        stopped_at = time.monotonic()
        process.send_signal(stop_signal)
        process.wait(timeout=STOP_SECONDS)
        took = time.monotonic() - stopped_at
        for thread in threads:
            thread.join(timeout=10)
            assert not thread.is_alive()
    assert took < STOP_SECONDS
    plain = answers["plain"]
    assert isinstance(plain, OSError) or (plain[0] == 503 and plain[1]["error"]["type"] == "server_stopping")
    stream = answers["stream"]
    assert stream == "closed" or isinstance(stream, OSError) or "stopping" in str(getattr(stream, "body", stream))


# ------------------------------------------------------------------------------------------------------------------
# 3. fields a variant cannot honour, values out of range
REFUSED_FIELDS = [
    # (endpoint, field, JSON value as sent, what the message says)
    ("completions", "n", "1000", "one choice per request"),
    ("completions", "best_of", "2", "one completion per request"),
    ("completions", "logprobs", "1", "log probabilities are not returned"),
    ("completions", "echo", "true", "the prompt is not echoed"),
    ("completions", "suffix", '"the end"', "without fill-in-the-middle"),
    ("completions", "top_p", "5", "5 is outside (0, 1]"),
    ("completions", "top_p", "0", "0 is outside (0, 1]"),
    ("completions", "temperature", "NaN", "nan is outside [0, 2]"),
    ("completions", "temperature", "-0.5", "-0.5 is outside [0, 2]"),
    ("completions", "temperature", "Infinity", "inf is outside [0, 2]"),
    ("completions", "max_tokens", "-3", "-3 is not a positive integer"),
    ("completions", "max_tokens", "2.5", "2.5 is not a positive integer"),
    ("completions", "presence_penalty", "0.5", "no presence penalty"),
    ("completions", "frequency_penalty", "-1.5", "outside (-1, 2]"),
    ("completions", "seed", "-1", "not an integer in [0, 2**64 - 1]"),
    ("completions", "stop", '["a", "b", "c", "d", "e"]', "a list of 1 to 4 strings"),
    ("completions", "stop", '""', "every stop string must be a non-empty string"),
    ("completions", "stream_options", '{"include_usage": true}', "taken only with stream: true"),
    ("completions", "logit_bias", '{"3": 5}', "taken by /v1/chat/completions only"),
    ("completions", "generation_config", '"{\\"num_beams\\": 8}"', "would pass around the limits"),
    ("completions", "prompt", '""', "empty: a causal LM needs at least one token"),
    ("completions", "prompt", '["a", "b"]', "is not a string"),
    ("chat", "n", "3", "one choice per request"),
    ("chat", "logprobs", "true", "log probabilities are not returned"),
    ("chat", "top_logprobs", "2", "log probabilities are not returned"),
    ("chat", "top_p", "1.5", "outside (0, 1]"),
    ("chat", "tools", '[{"type": "function", "function": {"name": "f"}}]', "no tool call would be parsed"),
    ("chat", "tool_choice", '"required"', "no tool call would be parsed"),
    ("chat", "response_format", '{"type": "json_object"}', "no output is constrained"),
    ("chat", "audio", '{"voice": "alloy", "format": "wav"}', "text only"),
    ("chat", "modalities", '["text", "audio"]', "text only"),
    ("chat", "store", "true", "nothing is stored"),
    ("chat", "reasoning_effort", '"high"', "no variant reasons"),
    ("chat", "logit_bias", '{"3": 500}', "outside [-100, 100]"),
    ("chat", "messages", "[]", "not a non-empty list of messages"),
    ("chat", "messages", '[{"role": "user", "content": [{"type": "image_url"}]}]', "only text parts are taken"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("endpoint", "name", "value", "says"), REFUSED_FIELDS)
def test_a_field_that_cannot_be_honoured_is_refused_in_one_line(guarded, folders, endpoint, name, value, says):
    url, _ = guarded
    model = json.dumps(folders["transfo-xl"])
    if endpoint == "completions":
        fields = {"model": model, "prompt": '"the lazy"', "max_tokens": "3"}
    else:
        fields = {"model": model, "messages": '[{"role": "user", "content": "the"}]', "max_tokens": "3"}
    fields[name] = value
    body = "{" + ", ".join(f'"{key}": {text}' for key, text in fields.items()) + "}"
    status, answer = post(url, f"/v1/{'completions' if endpoint == 'completions' else 'chat/completions'}", body)
    assert status == 400, answer
    message = answer["error"]["message"]
    assert answer["error"]["param"] == name and message.startswith(f"{name}: ") and says in message
    assert "\n" not in message


def test_every_field_of_the_openai_requests_has_a_rule():
    """A field the installed `openai` adds to a request type would pass unchecked: the table must name it."""
    from transformers.cli.serving.chat_completion import TransformersCompletionCreateParamsStreaming
    from transformers.cli.serving.completion import TransformersTextCompletionCreateParams

    for path, params in [
        (serve_requests.COMPLETIONS, TransformersTextCompletionCreateParams),
        (serve_requests.CHAT, TransformersCompletionCreateParamsStreaming),
    ]:
        assert set(params.__mutable_keys__) <= set(serve_requests.FIELDS[path]), path


def test_the_values_taken_are_taken():
    limits = serve_requests.Limits(max_new_tokens=16)
    taken = {
        "model": "m",
        "prompt": "the",
        "max_tokens": 16,
        "temperature": 0,
        "top_p": 1,
        "n": 1,
        "best_of": 1,
        "echo": False,
        "seed": 2**64 - 1,
        "stop": ["a", "b"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "frequency_penalty": 0.5,
        "presence_penalty": 0,
        "suffix": "",
        "user": "someone",
        "logit_bias": {},
    }
    serve_requests.check_body(serve_requests.COMPLETIONS, taken, limits)
    chat = {
        "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "text", "text": "y"}]}],
        "max_completion_tokens": 16,
        "logprobs": False,
        "logit_bias": {"3": -100},
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "store": False,
        "service_tier": "auto",
        "modalities": ["text"],
        "chat_template_kwargs": {},
    }
    serve_requests.check_body(serve_requests.CHAT, chat, limits)
    assert serve_requests.sampling({"temperature": 0.7}) is True
    assert serve_requests.sampling({"temperature": 0, "top_p": 0.5}) is False
    assert serve_requests.sampling({"top_p": 0.5}) is True and serve_requests.sampling({}) is None


# ------------------------------------------------------------------------------------------------------------------
# 4. batching
def _batches(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "[txv serve] batch of" in line]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["transfo-xl", "txv_sparse_transformer"])
def test_concurrent_greedy_requests_are_batched_each_as_if_alone(guarded, folders, model_type):
    """Transformer-XL's rows are left-padded (prompts of any length share a batch); the Sparse Transformer's are not
    (it counts positions from the first column), so its rows share a batch with rows of their own length."""
    url, log = guarded
    folder = folders[model_type]
    requests = [(TEXT[i : i + 5 + (i % 3) * 4], 6 + i % 4) for i in range(8)]
    solo = [_direct_completion(folder, prompt, new) for prompt, new in requests]
    before = len(_batches(log))
    with ThreadPoolExecutor(len(requests)) as pool:
        served = list(pool.map(lambda r: complete(url, folder, r[0], r[1], temperature=0), requests))
    assert served == solo
    batches = _batches(log)[before:]
    sizes = [int(line.split("batch of ")[1].split(" ")[0]) for line in batches]
    assert sum(sizes) == len(requests) and max(sizes) > 1, batches
    if model_type == "txv_sparse_transformer":  # one prompt length per batch
        for line in batches:
            lengths = json.loads(line.split("prompts of ")[1].split(" tokens")[0])
            assert len(set(lengths)) == 1, line


@pytest.mark.slow
def test_a_sampled_request_with_a_seed_gets_its_text_whatever_runs_beside_it(guarded, folders):
    url, _ = guarded
    folder = folders["transfo-xl"]
    sampled = {"temperature": 1.0, "top_p": 0.9, "seed": 1234}
    alone = complete(url, folder, "the quick", 12, **sampled)
    with ThreadPoolExecutor(6) as pool:
        greedy = [pool.submit(complete, url, folder, TEXT[i : i + 9], 12, temperature=0) for i in range(4)]
        beside = [pool.submit(complete, url, folder, "the quick", 12, **sampled) for _ in range(2)]
        assert [future.result() for future in beside] == [alone, alone]
        assert all(future.result() for future in greedy)
    assert alone != complete(url, folder, "the quick", 12, **{**sampled, "seed": 99})


@pytest.mark.slow
def test_a_bad_row_fails_alone_and_its_batch_is_answered(guarded, folders):
    """A prompt with ids outside the model's vocabulary fails generate() for the whole batch: the rows that got no
    token yet run again one by one, so only that request is answered with the error."""
    url, _ = guarded
    small = folders["small vocabulary"]
    good = ["a bad cafe", "a bad egg.", "bead"]  # the first 12 ids only
    solo = [_direct_completion(small, prompt, 5) for prompt in good]
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(post, url, "/v1/completions", {"model": small, "prompt": p, "max_tokens": 5, "temperature": 0})
            for p in [*good, "the lazy"]
        ]
        answers = [future.result() for future in futures]
    assert [answer[1]["choices"][0]["text"] for answer in answers[:3]] == solo
    status, bad = answers[3]
    assert status == 400 and "input_ids must be in [0, 12) (config.vocab_size)" in bad["error"]["message"]


@pytest.mark.slow
@pytest.mark.exact  # each row's greedy tokens, compared with torch.equal
def test_the_variants_said_to_take_left_padding_generate_each_row_as_alone():
    """serve_batching.LEFT_PADDING against the models: a left-padded batch gives each row's text alone (greedy),
    and every other causal variant refuses left padding (so the server batches its rows by length)."""
    import hf_txvariants as txv
    from hf_txvariants.cli.serve_batching import LEFT_PADDING
    from tiny_configs import TINY_CONFIGS, model_class, tiny_config

    causal = [name for name in txv.VARIANTS if model_class(name, "AutoModelForCausalLM") is not None]
    assert LEFT_PADDING <= set(causal)
    generator = torch.Generator().manual_seed(1)
    for model_type in causal:
        fields = {"pad_token_id": 0, "eos_token_id": None}
        if TINY_CONFIGS[model_type].get("max_position_embeddings", 64) < 64:
            fields["max_position_embeddings"] = 64
        torch.manual_seed(0)
        model = model_class(model_type, "AutoModelForCausalLM")(tiny_config(model_type, **fields)).eval()
        top = min(model.config.vocab_size, 30)
        prompts = [torch.randint(1, top, (n,), generator=generator) for n in (7, 11, 4)]
        alone = [
            model.generate(p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=8)[
                0, len(p) :
            ]
            for p in prompts
        ]
        ids = torch.zeros(3, 11, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, 11 - len(prompt) :], mask[row, 11 - len(prompt) :] = prompt, 1
        if model_type in LEFT_PADDING:
            batch = model.generate(ids, attention_mask=mask, max_new_tokens=8)[:, 11:]
            assert all(torch.equal(batch[row], alone[row]) for row in range(3)), model_type
        else:
            with pytest.raises(ValueError):
                model.generate(ids, attention_mask=mask, max_new_tokens=8)


@pytest.mark.slow
def test_a_request_that_arrives_while_a_batch_runs_is_served_before_that_batch_ends(guarded, folders):
    """The waiting request's batch runs inside the running batch's step (which pauses): both texts are what each
    request gets alone."""
    url, _ = guarded
    folder = folders["transfo-xl"]
    long_prompt, long_tokens = "the lazy dog", 1500
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0) as client:
        stream = client.completions.create(
            model=folder, prompt=long_prompt, max_tokens=long_tokens, temperature=0, stream=True
        )
        chunks = iter(stream)
        pieces = [next(chunks).choices[0].text]  # the long batch is running
        short = complete(url, folder, "a quick fox", 5, temperature=0)
        short_done = time.monotonic()
        pieces += [chunk.choices[0].text for chunk in chunks]
        long_done = time.monotonic()
    assert short_done < long_done - 0.1
    assert short == _direct_completion(folder, "a quick fox", 5)
    assert "".join(pieces) == _direct_completion(folder, long_prompt, long_tokens)


# ------------------------------------------------------------------------------------------------------------------
# 5. the load test, short (benchmarks/bench_serve.py --load runs it at 64 clients for 60 s)
@pytest.mark.slow
def test_a_short_load_test_gets_no_5xx_and_no_wrong_answer():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_serve.py"),
        "--load",
        "--clients",
        "8",
        "--seconds",
        "8",
    ]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "5xx: 0; wrong answers: 0" in run.stdout
    assert "the server still answers (a good request, checked): True" in run.stdout


def test_rows_share_a_batch_only_under_equal_settings():
    from transformers import GenerationConfig

    from hf_txvariants.cli.serve_batching import settings_key

    greedy = GenerationConfig(do_sample=False, max_new_tokens=5, stop_strings=["."])
    assert settings_key(greedy, False) == settings_key(GenerationConfig(do_sample=False, max_new_tokens=9), False)
    biased = GenerationConfig(do_sample=False, sequence_bias={(3,): -100.0})  # a chat request's logit_bias
    assert settings_key(biased, False) != settings_key(greedy, False)
    hot = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.9)
    assert settings_key(hot, True) != settings_key(GenerationConfig(do_sample=True, temperature=0.8, top_p=0.9), True)
