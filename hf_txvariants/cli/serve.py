"""`txv serve`: transformers' own OpenAI-compatible server (`transformers serve`, its `serving` extra) with the
plugin's causal LMs loadable.

`transformers serve` builds its model from `getattr(transformers, config.architectures[0])`, so a class that is not an
attribute of the `transformers` package (every plugin or remote-code class) dies while loading. `txv serve` runs
transformers' own `Serve` (the same endpoints, handlers, generation threads and flags) with one seam changed: its
model loader (`ModelManager._load_model`) loads through `AutoModelForCausalLM` a variant of this plugin (with the
plugin's code: transformers prefers a registered class to a folder's code) and, with `--trust-remote-code`, a folder
whose model type nothing registers (the code it carries, e.g. a variant saved by another version of the plugin).
transformers' own architectures and GGUF files are left to transformers' loader.

What transformers' server offers and a variant cannot take (continuous batching with paged attention, a
bitsandbytes quantization, torch.compile with a static cache, an attention implementation the class lacks) is
refused in one line naming the variant and the option: at start for the model given on the command
line, else in the answer to the request that names the model.

Bad requests get an answer naming the problem, and the server goes on: a model that cannot be found (404), a request
the model refuses (400: a token id outside its vocabulary, a chat request to a tokenizer without a chat template, a
refused option).

Two more seams make it a server no single request can hold (issue 52): a request guard in front of the app
(serve_requests.py: the body's size, every field of a completions or chat request checked against what the server
honours, the connection watched for a client that goes away) and transformers' `GenerationState` replaced by one
whose managers batch the requests (serve_batching.py: one worker per model, the limits, a row ended within a token of
its client's disconnect, its time limit or the server's stop). SIGINT / SIGTERM end every generation at once, then
uvicorn stops (3 s for open connections)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import os

from .errors import UsageError, one_line
from .serve_batching import Limits


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    import math

    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


# what `transformers serve` needs beyond transformers itself (its `serving` extra; `pip install hf-txvariants[serve]`)
SERVE_MODULES = ("fastapi", "uvicorn", "openai", "pydantic")


def add_parser(sub, name: str, help_text: str):
    """`txv serve` (see hf_txvariants_launcher.COMMANDS)."""
    serve = sub.add_parser(
        name,
        help=help_text,
        description="transformers' OpenAI-compatible server (`transformers serve`) with the plugin's causal LMs "
        "loadable: POST /v1/completions (streamed too) and /v1/chat/completions (where the tokenizer has a chat "
        "template), with transformers serve's other endpoints (GET /v1/models, /health, ...). Every flag is "
        "`transformers serve`'s own, passed to it unchanged; what a variant cannot take is refused naming the "
        "variant and the flag. Needs the serve extra: pip install 'hf-txvariants[serve]'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(serve)
    serve.set_defaults(func=run)
    return serve


def add_arguments(parser):
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a saved model folder or Hub repo id to load at start and serve alone (a request naming another model "
        "is refused); without it, each request's `model` is loaded on demand and unloaded after --model-timeout",
    )
    model = parser.add_argument_group("model options (transformers serve's)")
    model.add_argument("--device", default="auto", help="device for inference: auto, cpu, cuda, cuda:0, ...")
    model.add_argument(
        "--dtype", default="auto", help="weights' dtype: auto (as saved), float32, bfloat16, float16 (a torch dtype)"
    )
    model.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the code a model folder carries (its auto_map) for a model type that is not registered here, "
        "e.g. a variant saved by another version of the plugin (transformers prefers the plugin's registered "
        "classes to a folder's code)",
    )
    model.add_argument(
        "--attn-implementation",
        default=None,
        help="attention implementation (eager, sdpa, ...); refused for a variant whose class lacks it "
        "(flash_attention_2/3 and Hub kernels are refused for every variant; flex_attention is taken by the "
        "Transformer-XL family only)",
    )
    model.add_argument(
        "--quantization",
        default=None,
        choices=["bnb-4bit", "bnb-8bit"],
        help="bitsandbytes quantization; refused for every variant (none is tested quantized)",
    )
    model.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile with a static key/value cache; refused for every variant (their own caches are not "
        "static caches, and none is marked compilable in full graph)",
    )
    model.add_argument(
        "--model-timeout",
        type=int,
        default=300,
        help="seconds before an idle model is unloaded (-1: never); ignored when MODEL is given",
    )
    batching = parser.add_argument_group("continuous batching (transformers serve's; refused for every variant)")
    batching.add_argument(
        "--continuous-batching",
        action="store_true",
        help="continuous batching with paged attention; refused for every variant (paged attention needs attention "
        "that runs through transformers' attention interface over a key/value cache, which the variants do not "
        "have); so is every --cb-* flag",
    )
    batching.add_argument("--cb-block-size", type=int, default=None, help="KV cache block size in tokens")
    batching.add_argument("--cb-num-blocks", type=int, default=None, help="number of KV cache blocks")
    batching.add_argument("--cb-max-batch-tokens", type=int, default=None, help="maximum tokens per batch")
    batching.add_argument(
        "--cb-max-memory-percent", type=float, default=None, help="max GPU memory fraction for the KV cache (0-1)"
    )
    batching.add_argument(
        "--cb-use-cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CUDA graphs for continuous batching",
    )
    chat = parser.add_argument_group("chat (transformers serve's)")
    chat.add_argument(
        "--reasoning",
        default="auto",
        choices=["on", "off", "auto"],
        help="reasoning mode of chat templates that have one (enable_thinking); no effect on the others",
    )
    chat.add_argument(
        "--chat-template-kwargs",
        default=None,
        help="default JSON object of keyword arguments for apply_chat_template (a request's own override them)",
    )
    chat.add_argument(
        "--decision-config",
        default=None,
        help="JSON file of decision labels, temperatures and a chat template for POST /v1/systemone",
    )
    server = parser.add_argument_group("server (transformers serve's)")
    server.add_argument("--host", default="localhost", help="listen address")
    server.add_argument("--port", type=int, default=8000, help="listen port")
    server.add_argument("--enable-cors", action="store_true", help="permissive CORS (allow every origin)")
    server.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error", "critical"],
        help="transformers' logging level",
    )
    server.add_argument("--default-seed", type=int, default=None, help="torch seed set at start")
    limits = parser.add_argument_group(
        "limits (txv serve's own: a request over one is answered 400, naming the field, its value and the limit)"
    )
    limits.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=Limits.max_new_tokens,
        help="the most new tokens a request may ask (max_tokens, max_completion_tokens); a request that names none "
        "gets transformers serve's default (1024 or the model's own) capped to this",
    )
    limits.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        default=Limits.max_prompt_tokens,
        help="the longest prompt, in tokens (a chat request's: after its chat template)",
    )
    limits.add_argument(
        "--max-body-bytes", type=positive_int, default=Limits.max_body_bytes, help="the largest request body, in bytes"
    )
    limits.add_argument(
        "--request-timeout",
        type=positive_float,
        default=Limits.request_timeout,
        help="seconds a request may run, from its arrival (its wait for a batch included) to its last token; past it "
        "the generation ends within a token and the request is answered 408 (a stream: an error event, then closed)",
    )
    limits.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=Limits.max_batch_size,
        help="the most requests generated together in one batch (1: one request at a time)",
    )


# `Serve.__init__`'s keyword arguments that `txv serve` passes, named as its flags (tests/test_serve.py checks that
# every parameter of the installed release's `Serve` is here, with the same default)
SERVE_ARGUMENTS = (
    "device",
    "dtype",
    "trust_remote_code",
    "attn_implementation",
    "quantization",
    "compile",
    "model_timeout",
    "continuous_batching",
    "cb_block_size",
    "cb_num_blocks",
    "cb_max_batch_tokens",
    "cb_max_memory_percent",
    "cb_use_cuda_graph",
    "reasoning",
    "chat_template_kwargs",
    "decision_config",
    "host",
    "port",
    "enable_cors",
    "log_level",
    "default_seed",
)
CONTINUOUS_BATCHING_FLAGS = ("continuous_batching", "cb_block_size", "cb_num_blocks", "cb_max_batch_tokens")
CONTINUOUS_BATCHING_FLAGS += ("cb_max_memory_percent", "cb_use_cuda_graph")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def requested_options(args) -> dict:
    """The options given that a variant may refuse: `{flag as typed: value}`."""
    options = {}
    batching = [name for name in CONTINUOUS_BATCHING_FLAGS if getattr(args, name) not in (None, False)]
    if batching:
        options[flag(batching[0])] = getattr(args, batching[0])
    if args.compile:
        options["--compile"] = True
    if args.quantization is not None:
        options["--quantization"] = args.quantization
    if args.attn_implementation is not None:
        options["--attn-implementation"] = args.attn_implementation
    return options


# --------------------------------------------------------------------------------------------------------------------
# what a variant can take
def causal_lm_class(model_type: str):
    """The plugin's causal LM class of a variant (what its Hub folder's `auto_map` names for AutoModelForCausalLM)."""
    import sys

    import hf_txvariants

    pretrained_class = hf_txvariants.VARIANTS[model_type][1]
    class_name = pretrained_class.auto_classes.get("AutoModelForCausalLM")
    return getattr(sys.modules[pretrained_class.__module__], class_name) if class_name else None


def attention_implementations(model_class) -> list[str]:
    """The attention implementations a variant's class takes (its flags, as transformers reads them)."""
    supported = ["eager"]
    if model_class._supports_sdpa:
        supported.append("sdpa")
    if model_class._supports_flash_attn:
        supported += ["flash_attention_2", "flash_attention_3"]
    if model_class._supports_flex_attn:
        supported.append("flex_attention")
    return supported


def refusal(model_class, option: str, value) -> str | None:
    """Why the variant cannot take `option` (a `txv serve` flag, with its value), or None when it can."""
    if option in (flag(name) for name in CONTINUOUS_BATCHING_FLAGS):
        if not model_class._supports_attention_backend:
            return (
                "continuous batching runs paged attention through transformers' attention interface over a "
                "key/value cache, and this variant's attention and cache are its own"
            )
    elif option == "--compile":
        if not model_class._can_compile_fullgraph:
            return (
                "it compiles generation with a static key/value cache, which this variant's own cache is not "
                "(the class is not marked compilable in full graph)"
            )
    elif option == "--quantization":
        return "no variant of hf-txvariants is tested under bitsandbytes quantization"
    elif option == "--attn-implementation":
        supported = attention_implementations(model_class)
        if value not in supported:
            return f"it takes {', '.join(supported)}"
    return None


def check_options(config, options: dict) -> type:
    """The plugin's causal LM class for `config` (a variant's config), after refusing what it cannot take: a
    ValueError naming the variant and the option."""
    model_type = config.model_type
    model_class = causal_lm_class(model_type)
    architecture = (config.architectures or [None])[0]
    if model_class is None or (architecture is not None and architecture != model_class.__name__):
        raise ValueError(
            f"{model_type}: the folder holds a {architecture or 'model without architectures'}, not a causal LM "
            f"({model_class.__name__ if model_class else 'none for this variant'}); txv serve serves causal LMs"
        )
    for option, value in options.items():
        reason = refusal(model_class, option, value)
        if reason is not None:
            given = option if value is True else f"{option} {value}"
            raise ValueError(f"{model_type} ({model_class.__name__}) cannot take {given}: {reason}")
    return model_class


# --------------------------------------------------------------------------------------------------------------------
# transformers' server with the plugin's loader
def split_revision(model_id_and_revision: str) -> tuple[str, str | None]:
    """`name@revision` as ModelManager names a model (5.23 appends `@main` to local paths as well; 5.24 keeps an
    existing path whole)."""
    if os.path.exists(model_id_and_revision):
        return model_id_and_revision, None
    model_id, _, revision = model_id_and_revision.partition("@")
    return model_id, revision or None


@functools.cache
def model_manager_class():
    """transformers' `ModelManager` whose loader loads the plugin's variants (imported on first use: it needs the
    serving dependencies)."""
    from transformers.cli.serving.model_manager import ModelManager

    class TxvModelManager(ModelManager):
        """`_load_model` loads a variant with AutoModelForCausalLM after refusing the options it cannot take;
        `requested_options` is set before transformers' constructor runs (it preloads the model given at start)."""

        requested_options: dict = {}

        def load_model_and_processor(self, model_id_and_revision, *args, **kwargs):
            """transformers' (cache, lock, idle timer), with a load failure that names the model."""
            try:
                return super().load_model_and_processor(model_id_and_revision, *args, **kwargs)
            except (OSError, ValueError) as error:
                name = split_revision(model_id_and_revision)[0]
                message = f"{name}: {one_line(error)}"
                if not self.trust_remote_code and "trust_remote_code=True" in str(error):
                    message = (
                        f"{name}: its model type is not registered here; --trust-remote-code runs the code it carries"
                    )
                raise (OSError(message) if isinstance(error, OSError) else ValueError(message)) from error

        def _load_model(self, model_id_and_revision, tqdm_class=None, progress_callback=None, gguf_file=None):
            import transformers
            from transformers import AutoConfig, AutoModelForCausalLM

            import hf_txvariants

            if gguf_file is None:
                model_id, revision = split_revision(model_id_and_revision)
                config = AutoConfig.from_pretrained(
                    model_id, revision=revision, trust_remote_code=self.trust_remote_code
                )
                variant = config.model_type in hf_txvariants.VARIANTS
                if variant:
                    check_options(config, self.requested_options)
                # a variant (the plugin's code: transformers prefers a registered class to a folder's, with or
                # without --trust-remote-code), or a class transformers does not have: a folder's own code, for a
                # model type nothing registers (transformers asks for --trust-remote-code)
                if variant or not hasattr(transformers, (config.architectures or [""])[0]):
                    return AutoModelForCausalLM.from_pretrained(
                        model_id,
                        revision=revision,
                        attn_implementation=self.attn_implementation,
                        dtype=self.dtype,
                        device_map=self.device,
                        trust_remote_code=self.trust_remote_code,
                        tqdm_class=tqdm_class,
                    ).eval()
            # transformers' own architectures, and GGUF files (which hold only those)
            return super()._load_model(
                model_id_and_revision, tqdm_class=tqdm_class, progress_callback=progress_callback, gguf_file=gguf_file
            )

    return TxvModelManager


@contextlib.contextmanager
def plugin_loader(options: dict, limits: Limits | None = None):
    """While inside, transformers' server builds the plugin's `ModelManager` and the batching `GenerationState`
    (transformers' `Serve` imports both classes from their modules when it is constructed, and keeps the instances
    for the server's life)."""
    from transformers.cli.serving import model_manager, utils

    from .serve_batching import batching_generation_state_class

    manager_class = type("TxvServeModelManager", (model_manager_class(),), {"requested_options": dict(options)})
    original = model_manager.ModelManager, utils.GenerationState
    model_manager.ModelManager = manager_class
    utils.GenerationState = batching_generation_state_class(limits or Limits())
    try:
        yield manager_class
    finally:
        model_manager.ModelManager, utils.GenerationState = original


def error_answer(status: int, kind: str, error: BaseException, headers: dict | None = None):
    """An OpenAI-shaped error answer: `{"error": {"message", "type", "param", "code"}}`."""
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": one_line(error), "type": kind, "param": None, "code": None}},
        status_code=status,
        headers=headers,
    )


GRACEFUL_SHUTDOWN_SECONDS = 3  # uvicorn's wait for open connections once stopped, before it cancels them


@functools.cache
def serve_class():
    """transformers' `Serve`, run in the foreground with the request guard and the answers to bad requests added to
    its app, and a stop that ends every generation at once."""
    from transformers.cli.serve import Serve

    from .serve_batching import RequestEnded, Stopping, TimeLimit
    from .serve_requests import RequestGuard

    class TxvServe(Serve):
        limits: Limits = Limits()

        def start_server(self):
            """transformers' `Serve.__init__` calls this last (with `non_blocking=True`), once its FastAPI app and
            uvicorn server exist: the guard and the error answers are added before the app starts, then it serves
            in the foreground until interrupted."""
            app = self.server.config.app

            async def not_found(_request, error):
                return error_answer(404, "not_found_error", error)

            async def bad_request(_request, error):
                return error_answer(400, "invalid_request_error", error)

            async def ended(_request, error):
                # the row ended before its answer: past its time (408, not to be retried as it is), its client
                # gone (499, read by no one), the server stopping (503)
                headers = {"x-should-retry": "false"} if isinstance(error, TimeLimit) else None
                return error_answer(error.status, error.kind, error, headers)

            # a model that cannot be found or read (transformers raises OSError, naming it); a request the model or
            # transformers refuses (ValueError: out-of-vocabulary ids, no chat template, a refused option, a prompt
            # over --max-prompt-tokens, ...)
            app.add_exception_handler(OSError, not_found)
            app.add_exception_handler(ValueError, bad_request)
            app.add_exception_handler(RequestEnded, ended)
            app.add_middleware(RequestGuard, limits=self.limits)
            self.server.config.timeout_graceful_shutdown = GRACEFUL_SHUTDOWN_SECONDS
            handle_exit = self.server.handle_exit

            def stop(sig, frame):
                # SIGINT / SIGTERM: every row ends at its next token (a stream with an error event, a request with
                # 503), then uvicorn stops; nothing waits for a generation nobody reads
                Stopping.stopping = True
                handle_exit(sig, frame)

            self.server.handle_exit = stop
            self.server.run()

    return TxvServe


def check_serving_installed():
    missing = [name for name in SERVE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"txv serve needs transformers' serving dependencies ({', '.join(missing)} missing): "
            "pip install 'hf-txvariants[serve]'"
        )


def serve_arguments(args) -> dict:
    """`Serve.__init__`'s keyword arguments from the parsed flags."""
    import json

    if args.chat_template_kwargs is not None:
        try:
            parsed = json.loads(args.chat_template_kwargs)
        except json.JSONDecodeError as error:
            raise UsageError(f"--chat-template-kwargs is not valid JSON ({error})") from None
        if not isinstance(parsed, dict):
            raise UsageError(f"--chat-template-kwargs must be a JSON object, got {args.chat_template_kwargs!r}")
    return {name: getattr(args, name) for name in SERVE_ARGUMENTS}


LIMIT_ARGUMENTS = ("max_new_tokens", "max_prompt_tokens", "max_body_bytes", "request_timeout", "max_batch_size")


def limits_of(args) -> Limits:
    return Limits(**{name: getattr(args, name) for name in LIMIT_ARGUMENTS})


def run(args):
    check_serving_installed()
    kwargs = serve_arguments(args)
    limits = limits_of(args)
    with plugin_loader(requested_options(args), limits):
        try:
            # `non_blocking=True`: transformers' constructor calls `start_server`, which serves in the foreground here
            server_class = type("TxvServeWithLimits", (serve_class(),), {"limits": limits})
            server_class(force_model=args.model, non_blocking=True, **kwargs)
        except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: uvicorn has shut down cleanly by now
            return 0


__all__ = ["add_parser", "check_options", "model_manager_class", "plugin_loader", "refusal", "serve_class"]
