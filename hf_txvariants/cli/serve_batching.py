"""`txv serve`'s generation: one worker thread per model that runs the requests it is given in batches, each request
bounded by the server's limits, ended within a token when its client is gone, its time is up or the server stops.

A batch is one `generate()` call over the requests waiting when the worker is free (gathered while requests let in by
the guard are still on their way, at most 60 ms after the first, up to `--max-batch-size` rows): prompts left-padded for
the variants whose left-padded rows generate exactly what each row generates alone (`LEFT_PADDING`;
tests/test_serve_limits.py checks it), else rows of one prompt length only. A row leaves its batch when it ends (its own
`max_tokens`, an end-of-sequence token, one of its stop strings, its client gone, its time limit, the server stopping):
its answer is sent at once, and `generate()` stops when every row has ended, through one StoppingCriteria that reads
each row's new token at every step. Requests that arrive while a batch runs wait for its end, unless it is a long batch
(rows that ask more than 64 new tokens, `NEST_ABOVE`, share a batch only with each other): then, at its next step, their
own batch runs inside that step, the running batch paused until it ends (then the paused one runs 16 steps before it may
be paused again; at most `MAX_NESTING` deep; a paused row still ends on time, its client gone or its time up). They
cannot join the running batch's rows: no API merges the variants' caches, and a prompt run again with its new tokens
would not give the same text for the XL family (the memory of a segment is not the memory of its steps).

Rows share a batch only under equal generation settings (everything but `max_tokens` and the stop strings). Greedy rows
batch together. Sampled rows of equal settings batch together when none of them gives a `seed` (their draws come from
one generator, which no one can tell from separate ones); a sampled request with a `seed` runs in a batch of its own,
the generator seeded just before it, so the same request with the same seed gives the same text whatever else the server
is doing."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

# the variants whose left-padded rows generate what each row generates alone (their model cards; checked by
# tests/test_serve_batching.py); the others refuse left padding, so their rows batch with rows of the same length only
LEFT_PADDING = frozenset(
    {
        "transfo-xl",
        "txv_gtrxl",
        "txv_adaptive_span",
        "txv_vanilla",
        "txv_shaw",
        "txv_r_transformer",
        "txv_universal",
        "txv_act_rnn",
    }
)
GATHER_GAP_SECONDS = 0.005  # while requests are on their way to a worker, it looks again this often...
GATHER_IDLE_SECONDS = 0.01  # ... else it closes the batch when none arrived for this long...
GATHER_MOST_SECONDS = 0.06  # ... and at the latest this long after the first row
NEST_ABOVE = 64  # a batch with a row that has more new tokens than this to go lets the requests waiting meanwhile
# run inside it (a short batch is not paused: its end comes soon, and pausing it for the next would starve it)...
MAX_NESTING = 8  # ... this many batches deep at most...
STEPS_BETWEEN_NESTING = 16  # ... and after such a batch, the paused one takes this many steps before the next
POLL_SECONDS = 0.1  # how often an idle worker looks at the stop flag
IDLE_SECONDS = 1.0  # a worker idle this long after a job releases the memory its batches left...
RELEASE_ABOVE_BYTES = 64 << 20  # ... when the server holds this much more than after the last release


@dataclass
class Limits:
    """What a server owner lets one request ask (`txv serve --max-*`, `--request-timeout`, `--max-batch-size`)."""

    max_new_tokens: int = 1024
    max_prompt_tokens: int = 4096
    max_body_bytes: int = 1 << 20
    request_timeout: float = 120.0
    max_batch_size: int = 8


class RequestEnded(Exception):
    """A row ended before its answer was complete; `status` is the answer's HTTP status."""

    status = 500
    kind = "server_error"


class ClientGone(RequestEnded):
    status = 499  # nginx's "client closed request": nobody reads it
    kind = "client_closed_request"


class TimeLimit(RequestEnded):
    status = 408
    kind = "request_timeout"


class ServerStopping(RequestEnded):
    status = 503
    kind = "server_stopping"


class LimitError(ValueError):
    """A request over one of the server's limits (answered 400, naming the field, the value and the limit)."""


@dataclass
class RequestWatch:
    """What the server knows of one HTTP request while it runs: when it must end, whether its client is gone, and
    the fields of its body the worker needs (set by the request guard in serve.py)."""

    deadline: float
    timeout: float
    gone: bool = False
    seed: int | None = None
    sample: bool | None = None  # True: the request asked for sampling (temperature > 0 or top_p < 1)
    max_tokens_given: bool = True
    prompt_field: str = "prompt"
    arriving: bool = False  # counted in `Arriving` until `arrived()`

    def arrive(self):
        self.arriving = True
        Arriving.count += 1

    def arrived(self):
        if self.arriving:
            self.arriving = False
            Arriving.count -= 1

    queued: float = field(default_factory=time.monotonic)  # when its row joined the worker's queue


CURRENT_REQUEST: contextvars.ContextVar[RequestWatch | None] = contextvars.ContextVar("txv_request", default=None)


class Arriving:
    """How many requests the guard has let in that have not reached a worker yet (changed on the event loop's thread
    only: `RequestWatch.arrived`)."""

    count = 0


class Stopping:
    """Set once, from the signal handler (a plain attribute: a signal handler must not take a lock the interrupted
    thread may hold)."""

    stopping = False


def stream_safe(message: str) -> str:
    """transformers' stream puts an error's message inside a JSON string as it is."""
    return message.replace("\\", "/").replace('"', "'").replace("\n", " ")


class Row:
    """One request in the worker: its prompt ids, settings and where its answer goes."""

    def __init__(self, ids, gen_config, watch, processor, loop, stream_queue=None, future=None, parser=None):
        self.ids = ids
        self.gen_config = gen_config
        self.watch = watch
        self.processor = processor
        self.loop = loop
        self.queue = stream_queue
        self.future = future
        self.tokens: list[int] = []
        self.ended = False
        self.cancelled = False  # set by the stream's consumer (transformers' SSE generator calls cancel())
        self.total_tokens = 0
        self.stop_criteria = None
        self._decode = None
        self._parser = parser
        self.key = None

    # the streamer interface transformers' SSE generators read: total_tokens and cancel()
    def cancel(self):
        self.cancelled = True

    def _push(self, item):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def start_stream(self):
        from tokenizers.decoders import DecodeStream

        self._decode = DecodeStream([], skip_special_tokens=self._parser is None)
        if self._parser is not None:
            for item in parser_chunks(self._parser.initial_events):
                self._push(item)

    def add(self, token: int):
        self.tokens.append(token)
        self.total_tokens += 1
        if self.queue is None:
            return
        tokenizer = getattr(self.processor, "tokenizer", self.processor)._tokenizer
        text = self._decode.step(tokenizer, token)
        if text is None:
            return
        if self._parser is None:
            self._push(text)
        else:
            for item in parser_chunks(self._parser.feed(text)):
                self._push(item)

    def gone(self) -> bool:
        return self.cancelled or self.watch.gone

    def finish(self, error: BaseException | None = None):
        """The row's answer: its text (or the end of its stream), or `error`."""
        if self.ended:
            return
        self.ended = True
        if self.queue is not None:
            from transformers.cli.serving.utils import _StreamError

            if error is not None:
                self._push(_StreamError(stream_safe(str(error))))
                return
            if self._parser is not None:
                try:
                    _message, events = self._parser.finalize()
                except (ValueError, RuntimeError):
                    events = []
                for item in parser_chunks(events):
                    self._push(item)
            self._push(None)
            return
        if error is not None:
            self.loop.call_soon_threadsafe(_set_exception, self.future, error)
            return
        import torch

        generated = torch.tensor(self.tokens, dtype=torch.long)
        text = self.processor.decode(generated, skip_special_tokens=True)
        self.loop.call_soon_threadsafe(_set_result, self.future, (text, len(self.ids), generated))


def parser_chunks(events):
    """transformers' queue items for a response parser's events (only a tokenizer with a response template has a
    parser; imported then)."""
    from transformers.cli.serving.utils import response_events_to_chunks

    return response_events_to_chunks(events)


def _set_result(future, value):
    if not future.done():
        future.set_result(value)


def _set_exception(future, error):
    if not future.done():
        future.set_exception(error)


def settings_key(gen_config, sample: bool) -> str:
    """What rows must share to be generated together: every generation setting but the length and the stop strings
    (each row's own), and for greedy rows none of the sampling settings (greedy reads none of them)."""
    settings = gen_config.to_dict()
    ignored = {"max_new_tokens", "max_length", "stop_strings", "transformers_version", "_from_model_config"}
    if not sample:
        ignored |= {"temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff"}
    # repr, not JSON: a setting may be keyed by tuples (sequence_bias, from a chat request's logit_bias)
    return repr(sorted((name, repr(value)) for name, value in settings.items() if name not in ignored))


class RowCriteria:
    """The StoppingCriteria of a batch: at every step it hands each live row its new token and says which rows have
    ended (their own length, end-of-sequence token, stop strings; their client gone, their time up, the server
    stopping), finishing those rows' answers at once."""

    def __init__(self, rows, eos_ids: set[int], manager=None, depth: int = 0):
        self.rows = rows
        self.eos_ids = eos_ids
        self.manager = manager
        self.depth = depth
        self.steps_since_nesting = STEPS_BETWEEN_NESTING

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        new = input_ids[:, -1].tolist()
        now = time.monotonic()
        if self.manager is not None and self.manager._paused:
            self.manager.end_paused(now)
        for index, row in enumerate(self.rows):
            if row.ended:
                continue
            end = end_reason(row, now)
            if end is not None:
                row.finish(end)
                continue
            token = new[index]
            row.add(token)
            if (
                len(row.tokens) >= row.gen_config.max_new_tokens
                or token in self.eos_ids
                or (row.stop_criteria is not None and bool(row.stop_criteria(input_ids[index : index + 1], scores)))
            ):
                row.finish()
        if self.manager is not None and self.manager._rows and not all(row.ended for row in self.rows):
            self.manager.run_waiting(self)  # requests that arrived meanwhile: their batch may run now
        return torch.tensor([row.ended for row in self.rows], dtype=torch.bool, device=input_ids.device)


def end_reason(row, now: float) -> RequestEnded | None:
    if Stopping.stopping:
        return ServerStopping("the server is stopping")
    if row.gone():
        return ClientGone("the client closed the request")
    if now > row.watch.deadline:
        return TimeLimit(
            f"the request ran past its time limit of {row.watch.timeout:g} s (--request-timeout) after "
            f"{len(row.tokens)} new tokens"
        )
    return None


class BatchingManager:
    """transformers serve's generation manager (`generate_streaming`, `generate_non_streaming`, `submit`,
    `async_submit`, `stop`) for one model, batching the requests it is given on its own worker thread."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._condition = threading.Condition()
        self._rows: deque[Row] = deque()
        self._calls: deque = deque()
        self._stopped = False
        self._ran_since_idle = False  # a job ran since the memory was last released (`release_free_memory`)
        self._last_job = 0.0
        self._memory_floor: int | None = None  # the resident bytes after the last release (`release_free_memory`)
        self._paused: list[list[Row]] = []  # the rows of the batches paused under the running one, outermost first
        self.batches = 0  # how many generate() calls ran, and how many rows they held (for tests and benchmarks)
        self.batched_rows = 0
        self.largest_batch = 0
        self._thread = threading.Thread(target=self._run, name="txv-serve-batcher", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------------------------- requests
    def _row(self, model, processor, inputs, gen_config, stream_queue=None, future=None, parser=None) -> Row:
        watch = CURRENT_REQUEST.get()
        if watch is None:  # a request that did not pass the guard (transformers' own tests, a direct call)
            watch = RequestWatch(
                deadline=time.monotonic() + self.limits.request_timeout, timeout=self.limits.request_timeout
            )
        if Stopping.stopping:
            raise ServerStopping("the server is stopping")
        input_ids = inputs["input_ids"]
        ids = input_ids[0].tolist() if hasattr(input_ids, "tolist") else list(input_ids)
        if isinstance(ids and ids[0], list):
            ids = ids[0]
        if len(ids) > self.limits.max_prompt_tokens:
            raise LimitError(
                f"{watch.prompt_field}: {len(ids)} tokens, over the limit of {self.limits.max_prompt_tokens} "
                "(--max-prompt-tokens)"
            )
        gen_config = copy.deepcopy(gen_config)
        if not watch.max_tokens_given:
            gen_config.max_new_tokens = min(
                gen_config.max_new_tokens or self.limits.max_new_tokens, self.limits.max_new_tokens
            )
        if gen_config.max_new_tokens is None or gen_config.max_new_tokens > self.limits.max_new_tokens:
            raise LimitError(
                f"max_new_tokens: {gen_config.max_new_tokens}, over the limit of {self.limits.max_new_tokens} "
                "(--max-new-tokens)"
            )
        if watch.sample:
            gen_config.do_sample = True
        row = Row(ids, gen_config, watch, processor, asyncio.get_running_loop(), stream_queue, future, parser)
        sample = bool(gen_config.do_sample)
        key = settings_key(gen_config, sample)
        if getattr(model.config, "model_type", None) not in LEFT_PADDING:
            key += f"|length {len(ids)}"
        if gen_config.max_new_tokens > NEST_ABOVE:
            key += "|long"  # a long batch may be paused for the requests that wait (run_waiting): short rows never are
        if sample and watch.seed is not None:
            key += f"|seeded {id(row)}"  # a batch of its own: its seed decides its draws
        row.key = (id(model), key)
        row.model = model
        stop_strings = gen_config.stop_strings
        if stop_strings:
            from transformers import StopStringCriteria

            row.stop_criteria = StopStringCriteria(getattr(processor, "tokenizer", processor), stop_strings)
        gen_config.stop_strings = None
        return row

    def _enqueue(self, row: Row):
        row.watch.queued = time.monotonic()
        row.watch.arrived()
        with self._condition:
            self._rows.append(row)
            self._condition.notify_all()

    def generate_streaming(self, model, processor, inputs, gen_config, request_id, response_parser=None):
        queue: asyncio.Queue = asyncio.Queue()
        row = self._row(model, processor, inputs, gen_config, stream_queue=queue, parser=response_parser)
        row.start_stream()
        self._enqueue(row)
        return queue, row

    async def generate_non_streaming(self, model, processor, inputs, gen_config, request_id):
        future = asyncio.get_running_loop().create_future()
        row = self._row(model, processor, inputs, gen_config, future=future)
        self._enqueue(row)
        return await future

    def submit(self, fn, *args, **kwargs):
        from concurrent.futures import Future

        future = Future()
        with self._condition:
            self._calls.append((fn, args, kwargs, future, None))
            self._condition.notify_all()
        return future

    def async_submit(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._condition:
            self._calls.append((fn, args, kwargs, future, loop))
            self._condition.notify_all()
        return future

    def init_cb(self, model, gen_config):
        """Continuous batching is refused for every variant (cli/serve.py); nothing to start."""

    def stop(self):
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    # ---------------------------------------------------------------------------------------------- the worker
    def _next(self):
        """The next job: ("call", ...) or ("batch", rows); None once stopped."""
        with self._condition:
            while True:
                if self._stopped:
                    return None
                if Stopping.stopping:
                    self._end_waiting(ServerStopping("the server is stopping"))
                if self._calls:
                    self._last_job = time.monotonic()
                    return ("call", self._calls.popleft())
                if self._rows:
                    break
                if self._ran_since_idle and time.monotonic() - self._last_job > IDLE_SECONDS:
                    self._ran_since_idle = False
                    return ("idle", None)
                self._condition.wait(POLL_SECONDS)
            # gather the rows that arrive together with the first: while requests the guard has let in are still on
            # their way to a worker (tokenized, ...), and a moment more for one the guard has not read yet
            first = time.monotonic()
            last_count = len(self._rows)
            while len(self._same_key(self._rows[0].key)) < self.limits.max_batch_size:
                remaining = first + GATHER_MOST_SECONDS - time.monotonic()
                if remaining <= 0:
                    break
                arriving = Arriving.count > 0
                self._condition.wait(min(GATHER_GAP_SECONDS if arriving else GATHER_IDLE_SECONDS, remaining))
                if len(self._rows) == last_count and not arriving:
                    break
                last_count = len(self._rows)
            rows = self._same_key(self._rows[0].key)[: self.limits.max_batch_size]
            for row in rows:
                self._rows.remove(row)
            self._last_job = time.monotonic()
            return ("batch", rows)

    def run_waiting(self, running: RowCriteria):
        """Called by a running batch at every step: when one of its rows has more than `NEST_ABOVE` tokens to go and
        requests have waited for a batch at least the gathering time (a burst is whole by then), their batch runs now,
        inside this step,
        and the running batch goes on after it (while paused, its rows still end on time: `end_paused`). The random
        generator is put back as it was, so a running sampled batch draws what it would have drawn."""
        now = time.monotonic()
        if running.depth >= MAX_NESTING:
            return
        running.steps_since_nesting += 1
        if running.steps_since_nesting < STEPS_BETWEEN_NESTING:
            return
        if max(row.gen_config.max_new_tokens - len(row.tokens) for row in running.rows if not row.ended) <= NEST_ABOVE:
            return
        with self._condition:
            if not self._rows or now - self._rows[0].watch.queued < GATHER_MOST_SECONDS:
                return
            rows = self._same_key(self._rows[0].key)[: self.limits.max_batch_size]
            for row in rows:
                self._rows.remove(row)
        import torch

        running.steps_since_nesting = 0
        state = torch.get_rng_state()
        self._paused.append(running.rows)
        try:
            self._batch(rows, running.depth + 1)
        finally:
            self._paused.pop()
            torch.set_rng_state(state)

    def end_paused(self, now: float):
        """The rows of the batches paused under the running one end when theirs would (client gone, time up,
        server stopping): their answers go at once, and the batch skips them when it goes on."""
        for rows in self._paused:
            for row in rows:
                if not row.ended:
                    end = end_reason(row, now)
                    if end is not None:
                        row.finish(end)

    def _same_key(self, key):
        return [row for row in self._rows if row.key == key]

    def _end_waiting(self, error):
        while self._rows:
            self._rows.popleft().finish(error)

    def _run(self):
        import gc

        # what exists when a model's first request comes (the imports, the model) lives as long as the server: kept
        # out of every collection, so `release_free_memory` walks only what the batches made (a full collection of
        # transformers' and torch's objects takes ~0.3 s of CPU, the event loop waiting meanwhile)
        gc.freeze()
        while True:
            job = self._next()
            if job is None:
                return
            kind, payload = job
            if kind == "idle":
                self._memory_floor = release_free_memory(self._memory_floor)
                continue
            self._ran_since_idle = True
            try:
                if kind == "call":
                    self._call(*payload)
                else:
                    self._batch(payload)
            except Exception as error:  # the worker must live on: a dead one would leave every request waiting
                if kind == "batch":
                    for row in payload:
                        row.finish(error)
            job = payload = None  # let the model and the rows go before waiting again
            self._last_job = time.monotonic()

    @staticmethod
    def _call(fn, args, kwargs, future, loop):
        try:
            result = fn(*args, **kwargs)
        except Exception as error:  # handed to the caller, as transformers' inference thread does
            if loop is None:
                future.set_exception(error)
            else:
                loop.call_soon_threadsafe(_set_exception, future, error)
            return
        if loop is None:
            future.set_result(result)
        else:
            loop.call_soon_threadsafe(_set_result, future, result)

    def _batch(self, rows: list[Row], depth: int = 0):
        now = time.monotonic()
        live = []
        for row in rows:
            end = end_reason(row, now)
            if end is not None:
                row.finish(end)
            else:
                live.append(row)
        if not live:
            return
        try:
            self._generate(live, depth)
        except Exception as error:
            # one row's bad input fails the batch's generate(): the rows that got no token yet run again, each alone,
            # so only the row at fault is answered with the error
            if len(live) == 1:
                live[0].finish(error)
                return
            for row in live:
                if row.ended:
                    continue
                if row.tokens:
                    row.finish(error)
                else:
                    try:
                        self._generate([row], depth)
                    except Exception as row_error:
                        row.finish(row_error)

    def _generate(self, rows: list[Row], depth: int = 0):
        import torch

        model = rows[0].model
        gen_config = copy.deepcopy(rows[0].gen_config)
        gen_config.max_new_tokens = max(row.gen_config.max_new_tokens for row in rows)
        if gen_config.do_sample and rows[0].watch.seed is not None:
            torch.manual_seed(rows[0].watch.seed)
        longest = max(len(row.ids) for row in rows)
        pad = gen_config.pad_token_id
        if pad is None:
            pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        if isinstance(pad, (list, tuple)):
            pad = pad[0]
        gen_config.pad_token_id = pad
        input_ids = torch.full((len(rows), longest), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, longest - len(row.ids) :] = torch.tensor(row.ids, dtype=torch.long)
            attention_mask[index, longest - len(row.ids) :] = 1
        eos = gen_config.eos_token_id
        eos_ids = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
        criteria = RowCriteria(rows, eos_ids, self, depth)
        from transformers import StoppingCriteriaList

        device = getattr(model, "device", torch.device("cpu"))
        self.batches += 1
        self.batched_rows += len(rows)
        self.largest_batch = max(self.largest_batch, len(rows))
        from transformers.utils import logging

        # read by tests/test_serve_limits.py (`--log-level info`)
        logging.get_logger("transformers.cli.serving.txv").info(
            f"[txv serve] batch of {len(rows)} row(s), prompts of {sorted(len(row.ids) for row in rows)} tokens"
        )
        started, started_cpu = time.perf_counter(), time.thread_time()
        with torch.no_grad():
            model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=gen_config,
                stopping_criteria=StoppingCriteriaList([criteria]),
            )
        logging.get_logger("transformers.cli.serving.txv").info(
            f"[txv serve] the batch of {len(rows)} ran {time.perf_counter() - started:.3f} s "
            f"({time.thread_time() - started_cpu:.3f} s of CPU)"
        )
        for row in rows:  # generate() ended on its own criteria (its max_length): every row has its tokens
            row.finish()

    def stats(self) -> dict:
        return {"batches": self.batches, "rows": self.batched_rows, "largest_batch": self.largest_batch}


def batching_generation_state_class(limits: Limits):
    """transformers' `GenerationState` whose sequential managers are `BatchingManager`s."""
    from transformers.cli.serving.utils import GenerationState

    class TxvGenerationState(GenerationState):
        def get_manager(self, model_id, use_cb=False):
            if use_cb:
                return super().get_manager(model_id, use_cb=True)
            if model_id not in self._generate_managers:
                self._generate_managers[model_id] = BatchingManager(limits)
            return self._generate_managers[model_id]

        def shutdown(self):
            super().shutdown()
            for manager in self._generate_managers.values():
                manager.stop()

        def stats(self) -> dict:
            return {model_id: manager.stats() for model_id, manager in self._generate_managers.items()}

    return TxvGenerationState


def resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_free_memory(floor: int | None) -> int | None:
    """What the batches left, handed back to the system once the worker has been idle for `IDLE_SECONDS`, when the
    server's resident memory is more than `RELEASE_ABOVE_BYTES` above what it was after the last release (the first
    time, always): the tensors only reference cycles still hold (a collection), and the C heap's free pages (glibc
    keeps what a large batch freed), so the server's resident memory comes back from its peak after a load
    (benchmarks/results/serving.md, the load test), while a lightly used server keeps its pages (the next request would
    fault them in again). Returns the new floor."""
    if floor is not None and resident_bytes() < floor + RELEASE_ABOVE_BYTES:
        return floor
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
    after = resident_bytes()
    return after if floor is None else min(floor, after)
