"""
fastpar's native core: many prompts through one llama.cpp model in one batch.
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['ChatMessage', 'ChatRender', 'ChatReply', 'Completion', 'Context', 'ContextParams', 'Engine', 'EngineClosed', 'EngineStats', 'FastparError', 'GenerateParams', 'MAX_TOP_LOGPROBS', 'Model', 'ModelLoadError', 'ModelParams', 'PrefixCacheStats', 'QueueFull', 'RequestHandle', 'Stats', 'ToolCall', 'WakePipe', 'backend', 'new_tool_call_id', 'parse_reply', 'render_tools', 'version']
class FastparError(RuntimeError):
    pass
class ModelLoadError(FastparError):
    pass
class EngineClosed(FastparError):
    pass
class QueueFull(FastparError):
    pass
class ModelParams:
    """
    Options of a model load; defaults are fastpar's.
    """
    use_mmap: bool
    def __init__(self) -> None:
        ...
    def validate(self) -> None:
        """
        Raises ValueError naming the first option out of range.
        """
    @property
    def n_gpu_layers(self) -> int:
        ...
    @n_gpu_layers.setter
    def n_gpu_layers(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class ChatMessage:
    def __init__(self, role: str, content: str) -> None:
        ...
    @property
    def content(self) -> str:
        ...
    @property
    def role(self) -> str:
        ...
class ToolCall:
    """
    One tool call an output made.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict[str, typing.Any]:
        """
        Every field as a dict of plain values (json.dumps takes it as it is).
        """
    @property
    def arguments(self) -> str:
        """
        The arguments, a JSON object as text.
        """
    @property
    def id(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
class ChatRender:
    """
    A chat prompt with tools, as Model.render_chat makes it.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict[str, typing.Any]:
        """
        Every field as a dict of plain values (json.dumps takes it as it is).
        """
    @property
    def format(self) -> str:
        ...
    @property
    def grammar(self) -> str:
        ...
    @property
    def grammar_prefill(self) -> str:
        ...
    @property
    def parser(self) -> str:
        ...
    @property
    def prompt(self) -> str:
        ...
    @property
    def stops(self) -> list[str]:
        ...
class ChatReply:
    """
    A reply with tools, as parse_reply reads it.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict[str, typing.Any]:
        """
        Every field as a dict of plain values (json.dumps takes it as it is).
        """
    @property
    def content(self) -> str:
        ...
    @property
    def reasoning(self) -> str:
        ...
    @property
    def tool_calls(self) -> list[ToolCall]:
        ...
class Model:
    """
    A GGUF model loaded with llama.cpp.
    """
    def __init__(self, path: str, params: ModelParams) -> None:
        ...
    def apply_chat_template(self, messages: collections.abc.Sequence[ChatMessage]) -> str:
        """
        Messages rendered with the model's chat template, assistant turn opened.
        """
    def render_chat(self, messages: str, tools: str = '', tool_choice: str = 'auto', parallel_tool_calls: bool = False) -> ChatRender:
        """
        OpenAI messages and tools (JSON text) rendered with the model's Jinja chat template: the prompt, and the grammar and parser of its tool calls.
        """
    def rerank_prompt(self, query: str, document: str) -> list[int]:
        """
        The tokens a reranker scores for (query, document), as llama-server's /rerank makes them.
        """
    def token_bytes(self, token: typing.SupportsInt | typing.SupportsIndex) -> bytes:
        """
        The bytes one token stands for (possibly part of a UTF-8 character).
        """
    def tokenize(self, text: str, parse_special: bool = True, add_special: bool = True) -> list[int]:
        """
        Token ids of text, as generate would feed them (special tokens parsed unless parse_special=False;
        BOS/EOS as the vocabulary asks unless add_special=False).
        """
    @property
    def add_bos(self) -> bool:
        ...
    @property
    def chat_template(self) -> str | None:
        ...
    @property
    def description(self) -> str:
        ...
    @property
    def has_chat_template(self) -> bool:
        ...
    @property
    def n_ctx_train(self) -> int:
        ...
    @property
    def n_vocab(self) -> int:
        ...
    @property
    def native_tools(self) -> bool:
        """
        Whether the chat template describes tools itself (else the generic format is used).
        """
    @property
    def path(self) -> str:
        ...
    @property
    def token_bos(self) -> int:
        ...
    @property
    def token_eos(self) -> int:
        ...
class ContextParams:
    """
    Options of a context; defaults are fastpar's.
    """
    embeddings: bool
    kv_unified: bool
    pooling: str
    prefix_cache_dir: str
    share_prefixes: bool
    type_k: str
    type_v: str
    def __init__(self) -> None:
        ...
    def validate(self) -> None:
        """
        Raises ValueError naming the first option out of range.
        """
    @property
    def device_sampling(self) -> int:
        ...
    @device_sampling.setter
    def device_sampling(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_batch(self) -> int:
        ...
    @n_batch.setter
    def n_batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_ctx_per_seq(self) -> int:
        ...
    @n_ctx_per_seq.setter
    def n_ctx_per_seq(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_parallel(self) -> int:
        ...
    @n_parallel.setter
    def n_parallel(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_threads(self) -> int:
        ...
    @n_threads.setter
    def n_threads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def prefix_cache_mib(self) -> int:
        ...
    @prefix_cache_mib.setter
    def prefix_cache_mib(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def warmup(self) -> int:
        ...
    @warmup.setter
    def warmup(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class GenerateParams:
    """
    Options of a generate call; defaults are fastpar's.
    """
    grammar: str
    grammar_prefill: str
    ignore_eos: bool
    json_schema: str
    logprobs: bool
    parallel_tool_calls: bool
    prompt_logprobs: bool
    reasoning: str
    regex: str
    tool_choice: str
    tool_parser: str
    tools: str
    def __init__(self) -> None:
        ...
    def validate(self) -> None:
        """
        Raises ValueError naming the first option out of range.
        """
    @property
    def allowed_token_ids(self) -> list[int]:
        ...
    @allowed_token_ids.setter
    def allowed_token_ids(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def choice(self) -> list[str]:
        ...
    @choice.setter
    def choice(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
    @property
    def frequency_penalty(self) -> float:
        ...
    @frequency_penalty.setter
    def frequency_penalty(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def logit_bias(self) -> list[tuple[int, float]]:
        ...
    @logit_bias.setter
    def logit_bias(self, arg0: collections.abc.Sequence[tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]]) -> None:
        ...
    @property
    def max_tokens(self) -> int:
        ...
    @max_tokens.setter
    def max_tokens(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_p(self) -> float:
        ...
    @min_p.setter
    def min_p(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def n(self) -> int:
        ...
    @n.setter
    def n(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def presence_penalty(self) -> float:
        ...
    @presence_penalty.setter
    def presence_penalty(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def priority(self) -> int:
        ...
    @priority.setter
    def priority(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def prompt_logprobs_from(self) -> int:
        ...
    @prompt_logprobs_from.setter
    def prompt_logprobs_from(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def repeat_last_n(self) -> int:
        ...
    @repeat_last_n.setter
    def repeat_last_n(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def repeat_penalty(self) -> float:
        ...
    @repeat_penalty.setter
    def repeat_penalty(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def seed(self) -> int:
        ...
    @seed.setter
    def seed(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def stop(self) -> list[str]:
        ...
    @stop.setter
    def stop(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
    @property
    def temperature(self) -> float:
        ...
    @temperature.setter
    def temperature(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def top_k(self) -> int:
        ...
    @top_k.setter
    def top_k(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def top_logprobs(self) -> int:
        ...
    @top_logprobs.setter
    def top_logprobs(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def top_p(self) -> float:
        ...
    @top_p.setter
    def top_p(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class Completion:
    """
    The answer to one prompt.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict[str, typing.Any]:
        """
        Every field as a dict of plain values (json.dumps takes it as it is).
        """
    @property
    def embedding(self) -> list[float]:
        ...
    @property
    def error(self) -> str | None:
        ...
    @property
    def finish_reason(self) -> str:
        ...
    @property
    def logprobs(self) -> list[float]:
        ...
    @property
    def n_gen_tokens(self) -> int:
        ...
    @property
    def n_prompt_tokens(self) -> int:
        ...
    @property
    def n_prompt_tokens_cached(self) -> int:
        ...
    @property
    def n_prompt_tokens_shared(self) -> int:
        ...
    @property
    def prompt_greedy(self) -> list[bool]:
        ...
    @property
    def prompt_logprobs(self) -> list[float | None]:
        ...
    @property
    def prompt_token_ids(self) -> list[int]:
        ...
    @property
    def prompt_top_logprobs(self) -> list[list[tuple[int, str, float]]]:
        ...
    @property
    def reasoning(self) -> str:
        ...
    @property
    def t_first_token_ms(self) -> float:
        ...
    @property
    def t_queued_ms(self) -> float:
        ...
    @property
    def t_total_ms(self) -> float:
        ...
    @property
    def text(self) -> str:
        ...
    @property
    def token_ids(self) -> list[int]:
        ...
    @property
    def tool_calls(self) -> list[ToolCall]:
        ...
    @property
    def top_logprobs(self) -> list[list[tuple[int, str, float]]]:
        ...
class Stats:
    """
    Statistics of one generate call.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict[str, typing.Any]:
        """
        Every field as a dict of plain values (json.dumps takes it as it is).
        """
    @property
    def backend(self) -> str:
        ...
    @property
    def gen_tokens_per_s(self) -> float:
        ...
    @property
    def n_decode_calls(self) -> int:
        ...
    @property
    def n_device_sampled(self) -> int:
        ...
    @property
    def n_failed(self) -> int:
        ...
    @property
    def n_gen_tokens(self) -> int:
        ...
    @property
    def n_grammar_cached(self) -> int:
        ...
    @property
    def n_grammar_kept(self) -> int:
        ...
    @property
    def n_grammar_top(self) -> int:
        ...
    @property
    def n_grammar_whole(self) -> int:
        ...
    @property
    def n_grammar_wider(self) -> int:
        ...
    @property
    def n_kv_full_retries(self) -> int:
        ...
    @property
    def n_padding_tokens(self) -> int:
        ...
    @property
    def n_preempted(self) -> int:
        ...
    @property
    def n_prompt_tokens(self) -> int:
        ...
    @property
    def n_prompt_tokens_cached(self) -> int:
        ...
    @property
    def n_prompt_tokens_shared(self) -> int:
        ...
    @property
    def n_prompts(self) -> int:
        ...
    @property
    def n_threads_low(self) -> int:
        ...
    @property
    def prompt_tokens_per_s(self) -> float:
        ...
    @property
    def t_gen_ms(self) -> float:
        ...
    @property
    def t_prompt_ms(self) -> float:
        ...
    @property
    def t_sample_ms(self) -> float:
        ...
    @property
    def t_wall_ms(self) -> float:
        ...
    @property
    def total_tokens_per_s(self) -> float:
        ...
class PrefixCacheStats:
    """
    What a context's prefix cache holds and did.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict[str, typing.Any]:
        """
        Every field as a dict of plain values (json.dumps takes it as it is).
        """
    @property
    def budget_bytes(self) -> int:
        ...
    @property
    def bytes_host(self) -> int:
        ...
    @property
    def n_evicted(self) -> int:
        ...
    @property
    def n_hits(self) -> int:
        ...
    @property
    def n_host_entries(self) -> int:
        ...
    @property
    def n_host_tokens(self) -> int:
        ...
    @property
    def n_loaded(self) -> int:
        ...
    @property
    def n_not_saved(self) -> int:
        ...
    @property
    def n_refused(self) -> int:
        ...
    @property
    def n_restored(self) -> int:
        ...
    @property
    def n_saved(self) -> int:
        ...
    @property
    def n_slots_held(self) -> int:
        ...
    @property
    def n_tokens_held(self) -> int:
        ...
    @property
    def n_tokens_reused(self) -> int:
        ...
    @property
    def t_host_ms(self) -> float:
        ...
class Context:
    """
    A llama.cpp context with n_parallel slots.
    """
    def __init__(self, model: Model, params: ContextParams) -> None:
        ...
    def clear_prefix_cache(self) -> None:
        ...
    def embed(self, prompts: collections.abc.Sequence[str | collections.abc.Sequence[ChatMessage] | collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], normalize: bool, on_completion: collections.abc.Callable[[int, Completion], None] | None = None) -> tuple[numpy.typing.NDArray[numpy.float32], list[str | None]]:
        """
        Embed every text (an embeddings context): a float32 array of one row per text, in input
        order (NaN where a text failed), and each row's error or None.
        """
    def generate(self, prompts: collections.abc.Sequence[str | collections.abc.Sequence[ChatMessage] | collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], params: collections.abc.Sequence[GenerateParams], on_completion: collections.abc.Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """
        Run every prompt (str, or list of ChatMessage) to completion with params (one GenerateParams
        for all, or one per prompt); results in input order, a prompt's n samples in turn.
        on_completion(index, completion) is called as each finishes, with its index in the results.
        """
    def prefix_cache_stats(self) -> PrefixCacheStats:
        ...
    def save_prefix_cache(self) -> None:
        ...
    def seq_pos_max(self) -> list[int]:
        """
        llama_memory_seq_pos_max of every slot (-1 = empty).
        """
    @property
    def device_sampling(self) -> bool:
        ...
    @property
    def embedding_size(self) -> int:
        ...
    @property
    def embeddings(self) -> bool:
        ...
    @property
    def kv_unified(self) -> bool:
        ...
    @property
    def last_stats(self) -> Stats:
        ...
    @property
    def n_batch(self) -> int:
        ...
    @property
    def n_ctx_per_seq(self) -> int:
        ...
    @property
    def n_parallel(self) -> int:
        ...
    @property
    def n_threads(self) -> int:
        ...
    @property
    def pooling(self) -> str:
        ...
    @property
    def prefix_cache_dir(self) -> str:
        ...
    @property
    def prefix_cache_mib(self) -> int:
        ...
    @property
    def share_prefixes(self) -> bool:
        ...
    @property
    def type_k(self) -> str:
        ...
    @property
    def type_v(self) -> str:
        ...
    @property
    def warmed_up(self) -> bool:
        ...
class EngineStats:
    """
    A snapshot of an Engine's counters.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict[str, typing.Any]:
        """
        Every field as a dict of plain values (json.dumps takes it as it is).
        """
    @property
    def busy_s(self) -> float:
        ...
    @property
    def gen_tokens_per_s(self) -> float:
        ...
    @property
    def n_active(self) -> int:
        ...
    @property
    def n_cancelled(self) -> int:
        ...
    @property
    def n_completed(self) -> int:
        ...
    @property
    def n_decode_calls(self) -> int:
        ...
    @property
    def n_failed(self) -> int:
        ...
    @property
    def n_gen_tokens(self) -> int:
        ...
    @property
    def n_padding_tokens(self) -> int:
        ...
    @property
    def n_preempted(self) -> int:
        ...
    @property
    def n_prompt_tokens(self) -> int:
        ...
    @property
    def n_prompt_tokens_cached(self) -> int:
        ...
    @property
    def n_prompt_tokens_shared(self) -> int:
        ...
    @property
    def n_queued(self) -> int:
        ...
    @property
    def n_submitted(self) -> int:
        ...
    @property
    def uptime_s(self) -> float:
        ...
class WakePipe:
    """
    A pipe the engine's thread writes to when watched requests have news.
    """
    def __init__(self) -> None:
        ...
    def drain(self) -> list[int]:
        ...
    def fileno(self) -> int:
        ...
class RequestHandle:
    """
    One request of an Engine: a prompt and its samples.
    """
    def cancel(self) -> None:
        ...
    def done(self) -> bool:
        ...
    def next_piece(self, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> tuple[int, str] | None:
        ...
    def result(self, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> list[Completion]:
        ...
    def sample_done(self, sample: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def sample_result(self, sample: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> Completion:
        ...
    def set_listener(self, listener: collections.abc.Callable[[], None]) -> None:
        ...
    def set_wake(self, pipe: WakePipe, token: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def take_pieces(self) -> list[tuple[int, str]]:
        ...
    @property
    def id(self) -> int:
        ...
    @property
    def n_samples(self) -> int:
        ...
class Engine:
    """
    The scheduler loop on a worker thread.
    """
    def __init__(self, model: Model, params: ContextParams, max_queued: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def clear_prefix_cache(self) -> None:
        ...
    def close(self) -> None:
        ...
    def prefix_cache_stats(self) -> PrefixCacheStats:
        ...
    def seq_pos_max(self) -> list[int]:
        ...
    def stats(self) -> EngineStats:
        ...
    def submit(self, prompt: str | collections.abc.Sequence[ChatMessage] | collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], params: GenerateParams, timeout: typing.SupportsFloat | typing.SupportsIndex | None = 0.0) -> RequestHandle:
        ...
    def submit_embedding(self, prompt: str | collections.abc.Sequence[ChatMessage] | collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], normalize: bool, timeout: typing.SupportsFloat | typing.SupportsIndex | None = 0.0) -> RequestHandle:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def embedding_size(self) -> int:
        ...
    @property
    def embeddings(self) -> bool:
        ...
    @property
    def n_ctx_per_seq(self) -> int:
        ...
    @property
    def n_parallel(self) -> int:
        ...
    @property
    def pooling(self) -> str:
        ...
def backend() -> str:
    """
    Backend the native library was built for: 'cpu', 'cuda' or 'metal'.
    """
def new_tool_call_id() -> str:
    """
    A fresh tool-call id ("call_" and 24 random characters).
    """
def parse_reply(parser: str, text: str, partial: bool = False) -> ChatReply:
    """
    The content, thought and tool calls of `text` as a ChatRender's parser reads them; with partial, of a prefix of an output (calls not finished yet are left out). Calls get no ids.
    """
def render_tools(model: Model, messages: str, params: GenerateParams) -> tuple[str, GenerateParams]:
    """
    OpenAI messages (JSON text) rendered with params' tools by the model's template: the prompt text, and the params to generate it with (the calls' grammar, parser and stops; tools cleared).
    """
def version() -> str:
    """
    Version of the native library.
    """
MAX_TOP_LOGPROBS: int = 20
