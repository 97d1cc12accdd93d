"""`txv serve`'s request guard: the ASGI middleware in front of transformers' app that bounds every request (its
body size, its time), refuses in one line (400) every field of an OpenAI completions or chat request that the server
cannot honour or whose value is out of range, and watches the connection so that a client that goes away ends its
generation (serve_batching.py reads the watch).

What each field gets, `/v1/completions` (C) and `/v1/chat/completions` (chat), is the table `FIELDS` below
(tests/test_serve_fields.py checks that it names every field of the installed `openai` request types)."""

from __future__ import annotations

import asyncio
import json
import math
import time

from .serve_batching import CURRENT_REQUEST, Limits, RequestWatch

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MAX_SEED = 2**64 - 1  # torch.manual_seed's range (a negative seed is taken modulo 2**64 by torch; refused here)
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class Refused(ValueError):
    """A field refused: `param` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------------- the rules
# each rule returns None (taken) or why the value is refused; `limits` are the server's
def absent_or(*allowed):
    """Taken only when absent (null) or one of `allowed`: what the server cannot honour otherwise."""

    def rule(value, body, limits, why):
        if value is None or any(value == a and type(value) is type(a) for a in allowed):
            return None
        return why

    return rule


def not_honoured(why: str, *allowed):
    rule = absent_or(*allowed)
    return lambda value, body, limits: rule(value, body, limits, why)


def string_or_null(value, body, limits):
    return None if value is None or isinstance(value, str) else f"{_show(value)} is not a string"


def boolean(value, body, limits):
    return None if value is None or isinstance(value, bool) else f"{_show(value)} is not true or false"


def model_name(value, body, limits):
    if value is None or (isinstance(value, str) and value):
        return None
    return f"{_show(value)} is not a model name"


def temperature(value, body, limits):
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= 2:
        return f"{_show(value)} is outside [0, 2] (0: greedy)"
    return None


def top_p(value, body, limits):
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or not 0 < value <= 1:
        return f"{_show(value)} is outside (0, 1]"
    return None


def seed(value, body, limits):
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= MAX_SEED:
        return f"{_show(value)} is not an integer in [0, 2**64 - 1]"
    return None


def frequency_penalty(value, body, limits):
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or not -1 < value <= 2:
        return (
            f"{_show(value)} is outside (-1, 2] (it is transformers' repetition_penalty 1 + value, which must be "
            "positive)"
        )
    return None


def max_tokens(value, body, limits):
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        return f"{_show(value)} is not a positive integer"
    if value > limits.max_new_tokens:
        return f"{value}, over the limit of {limits.max_new_tokens} (--max-new-tokens)"
    return None


def n(value, body, limits):
    if value is None or (_is_int(value) and value == 1):
        return None
    return f"{_show(value)}: one choice per request is generated (send the request n times)"


def best_of(value, body, limits):
    if value is None or (_is_int(value) and value == 1):
        return None
    return f"{_show(value)}: one completion per request is generated, none is ranked"


def stop(value, body, limits):
    if value is None:
        return None
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not 1 <= len(strings) <= 4:
        return f"{_show(value)} is not a string or a list of 1 to 4 strings"
    if not all(isinstance(s, str) and s for s in strings):
        return f"{_show(value)}: every stop string must be a non-empty string"
    return None


def stream_options(value, body, limits):
    if value is None:
        return None
    if not body.get("stream"):
        return "taken only with stream: true"
    if not isinstance(value, dict) or set(value) - {"include_usage"}:
        return f"{_show(value)}: only include_usage is taken (the usage comes with the last chunk)"
    return None if isinstance(value.get("include_usage", False), bool) else "include_usage is not true or false"


def completion_prompt(value, body, limits):
    if not isinstance(value, str):
        return f"{_show(value)} is not a string (one text prompt per request; token ids and lists are not taken)"
    if not value:
        return "empty: a causal LM needs at least one token to continue"
    return None


def completion_logprobs(value, body, limits):
    return None if value is None else "log probabilities are not returned"


def completion_logit_bias(value, body, limits):
    return None if value is None or value == {} else "taken by /v1/chat/completions only"


def suffix(value, body, limits):
    if value is None or value == "":
        return None
    return "the variants are causal LMs without fill-in-the-middle: the completion could not depend on a suffix"


def chat_logprobs(value, body, limits):
    return None if value in (None, False) else "log probabilities are not returned"


def chat_logit_bias(value, body, limits):
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"{_show(value)} is not an object of token ids to biases"
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            return f"{_show(key)} is not a token id"
        if not _is_number(bias) or not math.isfinite(bias) or not -100 <= bias <= 100:
            return f"the bias of {key}, {_show(bias)}, is outside [-100, 100]"
    return None


def messages(value, body, limits):
    if not isinstance(value, list) or not value:
        return "not a non-empty list of messages"
    for index, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            return f"message {index} has no role among {', '.join(CHAT_ROLES)}"
        content = message.get("content")
        if content is None and not message.get("tool_calls"):
            return f"message {index} has no content"
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    return f"message {index}: only text parts are taken (a text model)"
        elif content is not None and not isinstance(content, str):
            return f"message {index}: content is not a string or a list of text parts"
    return None


def response_format(value, body, limits):
    if value is None or value == {"type": "text"}:
        return None
    return "only {'type': 'text'}: no output is constrained to a format or schema"


def service_tier(value, body, limits):
    return None if value in (None, "auto", "default") else f"{_show(value)}: one tier only (auto)"


def modalities(value, body, limits):
    return None if value in (None, ["text"]) else f"{_show(value)}: text only"


def template_kwargs(value, body, limits):
    return None if value is None or isinstance(value, dict) else f"{_show(value)} is not an object"


GENERATION_CONFIG = not_honoured(
    "not taken by txv serve: a generation config's settings would pass around the limits and these checks"
)
PRESENCE = not_honoured("not honoured: generate() has no presence penalty", 0, 0.0)
TOOLS = "tool calling: no tool call would be parsed from a variant's text (no response template)"

COMMON = {
    "model": model_name,
    "stream": boolean,
    "temperature": temperature,
    "top_p": top_p,
    "seed": seed,
    "n": n,
    "frequency_penalty": frequency_penalty,
    "presence_penalty": PRESENCE,
    "stop": stop,
    "stream_options": stream_options,
    "user": string_or_null,  # an identifier of the end user: nothing to honour
    "max_tokens": max_tokens,
    "generation_config": GENERATION_CONFIG,
}
FIELDS = {
    COMPLETIONS: {
        **COMMON,
        "prompt": completion_prompt,
        "best_of": best_of,
        "echo": not_honoured("the prompt is not echoed", False),
        "logprobs": completion_logprobs,
        "logit_bias": completion_logit_bias,
        "suffix": suffix,
    },
    CHAT: {
        **COMMON,
        "messages": messages,
        "max_completion_tokens": max_tokens,
        "logprobs": chat_logprobs,
        "top_logprobs": not_honoured("log probabilities are not returned"),
        "logit_bias": chat_logit_bias,
        "audio": not_honoured("text only"),
        "modalities": modalities,
        "prediction": not_honoured("predicted outputs are not taken"),
        "web_search_options": not_honoured("no web search"),
        "response_format": response_format,
        "reasoning_effort": not_honoured("no variant reasons through its chat template"),
        "verbosity": not_honoured("no variant takes a verbosity"),
        "service_tier": service_tier,
        "moderation": not_honoured("no moderation model runs here"),
        "store": not_honoured("nothing is stored", False),
        "metadata": not_honoured("nothing is stored to tag with it", {}),
        "tools": not_honoured(TOOLS, []),
        "tool_choice": not_honoured(TOOLS, "none"),
        "functions": not_honoured(TOOLS, []),
        "function_call": not_honoured(TOOLS, "none"),
        "parallel_tool_calls": not_honoured(TOOLS),
        # identifiers that change nothing in the answer (no cache and no safety system to key)
        "prompt_cache_key": string_or_null,
        "prompt_cache_retention": string_or_null,
        "prompt_cache_options": not_honoured("no prompt cache"),
        "safety_identifier": string_or_null,
        "chat_template_kwargs": template_kwargs,
    },
}


def check_body(path: str, body, limits: Limits) -> None:
    """Raise `Refused` naming the first field of `body` (a completions or chat request) that is refused."""
    rules = FIELDS[path]
    if not isinstance(body, dict):
        raise Refused("body", "not a JSON object")
    required = "prompt" if path == COMPLETIONS else "messages"
    if required not in body:
        raise Refused(required, "missing")
    for name, value in body.items():
        rule = rules.get(name)
        if rule is None:
            continue  # transformers answers 422 for a field the request type does not have
        why = rule(value, body, limits)
        if why is not None:
            raise Refused(name, why)


def sampling(body: dict) -> bool | None:
    """Whether the request asks for sampling: temperature > 0 (0 is greedy), else top_p < 1; None when it names
    neither (the model's generation config decides, greedy for every variant saved by the plugin)."""
    if body.get("temperature") is not None:
        return body["temperature"] > 0
    if body.get("top_p") is not None:
        return body["top_p"] < 1
    return None


# ---------------------------------------------------------------------------------------------------- the guard
def error_body(message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


async def _answer(send, status: int, body: dict, headers: list | None = None):
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": payload})


class RequestGuard:
    """ASGI middleware: reads the body (up to --max-body-bytes), checks the fields of completions and chat
    requests, and while the app answers keeps a `RequestWatch` (its deadline, whether the client is gone) in
    `CURRENT_REQUEST` for the generation worker."""

    def __init__(self, app, limits: Limits):
        self.app = app
        self.limits = limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limits.max_body_bytes
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._too_large(send, int(declared))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self._too_large(send, size, at_least=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        timeout = self.limits.request_timeout
        watch = RequestWatch(deadline=time.monotonic() + timeout, timeout=timeout)
        path = scope.get("path", "")
        if scope.get("method") == "POST" and path in FIELDS | {RESPONSES: None}:
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                parsed = None  # transformers answers a body that is not JSON
            if parsed is not None:
                try:
                    body = self._check(path, parsed, watch)
                except Refused as refused:
                    return await _answer(send, 400, error_body(str(refused), "invalid_request_error", refused.param))
        return await self._serve(scope, receive, send, body, watch)

    def _check(self, path: str, parsed, watch: RequestWatch) -> bytes:
        """The body the app gets (the seed taken out: the worker seeds the request's own batch), after the checks."""
        if path == RESPONSES:
            if isinstance(parsed, dict):
                value = parsed.get("max_output_tokens")
                why = max_tokens(value, parsed, self.limits)
                if why is not None:
                    raise Refused("max_output_tokens", why)
                watch.max_tokens_given = value is not None
            return json.dumps(parsed).encode()
        check_body(path, parsed, self.limits)
        if isinstance(parsed.get("logit_bias"), dict):  # transformers' sequence_bias takes float biases only
            parsed["logit_bias"] = {token: float(bias) for token, bias in parsed["logit_bias"].items()}
        watch.seed = parsed.pop("seed", None)
        watch.sample = sampling(parsed)
        watch.max_tokens_given = any(parsed.get(name) is not None for name in ("max_tokens", "max_completion_tokens"))
        watch.prompt_field = "prompt" if path == COMPLETIONS else "messages"
        watch.arrive()  # on its way to a worker: the worker's batch waits for it (serve_batching.Arriving)
        return json.dumps(parsed).encode()

    async def _too_large(self, send, size: int, at_least: bool = False):
        more = "more than " if at_least else ""
        message = f"body: {more}{size} bytes, over the limit of {self.limits.max_body_bytes} (--max-body-bytes)"
        await _answer(send, 400, error_body(message, "invalid_request_error", "body"), [(b"connection", b"close")])

    async def _serve(self, scope, receive, send, body: bytes, watch: RequestWatch):
        messages: asyncio.Queue = asyncio.Queue()
        replayed = False

        async def watch_connection():
            # the only reader of the server's receive() from now on: a disconnect marks the request gone
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    watch.gone = True
                    await messages.put(message)
                    return
                await messages.put(message)

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await messages.get()

        complete = False

        async def sending(message):
            nonlocal complete
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        watcher = asyncio.create_task(watch_connection())
        token = CURRENT_REQUEST.set(watch)
        try:
            await self.app(scope, replay, sending)
        finally:
            watch.arrived()  # in case it never reached a worker (refused on the way)
            CURRENT_REQUEST.reset(token)
            if not complete:
                watch.gone = True  # the app gave up (cancelled, or its answer failed): nothing waits for the row
            watcher.cancel()
