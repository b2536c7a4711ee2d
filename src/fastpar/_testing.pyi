"""
fastpar's test and benchmark hooks (not part of the API).
"""
from __future__ import annotations
import collections.abc
import fastpar._core
import typing
__all__: list[str] = ['CHUNK_PADDING_PER_PASS', 'MAX_PADDED_GAP_GPU', 'MIN_POOLED', 'MIN_POOLED_WORK', 'MIN_SHARED_PREFIX', 'MIN_SPLIT', 'PlanInput', 'PrefixSharing', 'REFILL_WAVE_DIVISOR', 'STREAMING_DECODE_WAITS', 'STREAMING_WAVE_HOLD', 'SharingView', 'StepPolicy', 'TextStream', 'UNLIMITED_DECODE_WAITS', 'UNLIMITED_WAVE_HOLD', 'allowed_sets', 'available_cpus', 'cgroup_cpu_quota', 'choose_way', 'choose_work', 'compare_masks', 'cpu_batch', 'cpus_within', 'device_serves', 'engine_with_policy', 'fail_engine_worker', 'generate_with_policy', 'gpu_batch', 'measure_grammar', 'plan_step', 'resolve_step_policy', 'rows_split', 'sample_against_llama', 'set_allowed_sets', 'set_cache_selective', 'streaming_step_policy', 'stress_task_pool', 'thread_governor_decide']
class StepPolicy:
    """
    The step's CPU/GPU choices (core/loop/step_policy.hpp).
    """
    compact_slots: bool
    equal_chunks: bool
    last_prompt_token_alone: bool
    longest_first: bool
    prompts_first: bool
    share_prefixes: bool
    split_rows: bool
    def __init__(self) -> None:
        ...
    @property
    def mask_workers(self) -> int:
        ...
    @mask_workers.setter
    def mask_workers(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_decode_waits(self) -> int:
        ...
    @max_decode_waits.setter
    def max_decode_waits(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_padded_gap(self) -> int:
        ...
    @max_padded_gap.setter
    def max_padded_gap(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_wave_hold(self) -> int:
        ...
    @max_wave_hold.setter
    def max_wave_hold(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def pool_anticipate_us(self) -> int:
        ...
    @property
    def pool_caller_spin_us(self) -> int:
        ...
    @property
    def refill_wave(self) -> int:
        ...
    @refill_wave.setter
    def refill_wave(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class PlanInput:
    """
    One slot as the step planner sees it.
    """
    active: bool
    prefilling: bool
    waiting: bool
    def __init__(self, active: bool = False, prefilling: bool = False, waiting: bool = False, left: typing.SupportsInt | typing.SupportsIndex = 0, priority: typing.SupportsInt | typing.SupportsIndex = 0, order: typing.SupportsInt | typing.SupportsIndex = 0, room: typing.SupportsInt | typing.SupportsIndex = 18446744073709551615) -> None:
        ...
    @property
    def left(self) -> int:
        ...
    @left.setter
    def left(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def order(self) -> int:
        ...
    @order.setter
    def order(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def priority(self) -> int:
        ...
    @priority.setter
    def priority(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def room(self) -> int:
        ...
    @room.setter
    def room(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class SharingView:
    """
    One slot as prefix sharing sees it.
    """
    active: bool
    def __init__(self, active: bool = False, n_fed: typing.SupportsInt | typing.SupportsIndex = 0, prompt_size: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    @property
    def copied(self) -> bool:
        ...
    @property
    def donor(self) -> int:
        ...
    @property
    def n_fed(self) -> int:
        ...
    @n_fed.setter
    def n_fed(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def prompt_size(self) -> int:
        ...
    @prompt_size.setter
    def prompt_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def waiting(self) -> bool:
        ...
class PrefixSharing:
    """
    core/loop/prefix_sharing.hpp's decisions, without a KV cache.
    """
    def __init__(self, n_slots: typing.SupportsInt | typing.SupportsIndex, min_shared: typing.SupportsInt | typing.SupportsIndex = 16) -> None:
        ...
    def common(self, a: typing.SupportsInt | typing.SupportsIndex, b: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def decide(self, slots: collections.abc.Sequence[SharingView]) -> list[SharingView]:
        """
        The slots with waiting, copied, donor and n_fed decided for one step.
        """
    def pair_up(self, a: typing.SupportsInt | typing.SupportsIndex, prompt_a: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], b: typing.SupportsInt | typing.SupportsIndex, prompt_b: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], samples: bool = False) -> None:
        ...
class TextStream:
    """
    core/loop/text_stream.hpp: a generation's text, stop strings, pieces.
    """
    def __init__(self, streaming: bool = True) -> None:
        ...
    def append(self, piece: bytes, stops: collections.abc.Sequence[str] = []) -> bool:
        ...
    def next_piece(self, stops: collections.abc.Sequence[str] = [], final: bool = False) -> str:
        ...
    def take_text(self) -> str:
        ...
    @property
    def bytes(self) -> bytes:
        ...
def allowed_sets(ctx: fastpar._core.Context) -> bool:
    """
    Whether ctx's constrained rows share allowed-token sets.
    """
def available_cpus() -> int:
    """
    CPUs this process may use: n_threads=None's threads (core/threads/cpus.hpp).
    """
def cgroup_cpu_quota(root: str) -> float:
    """
    The CPU quota (CPUs; 0: none) of the cgroups named under root/proc/self (core/threads/cpus.hpp).
    """
def choose_way(n_rows: typing.SupportsInt | typing.SupportsIndex, work: typing.SupportsInt | typing.SupportsIndex, have_pool: bool, split_rows: bool, rows_split: bool) -> str:
    """
    core/sampling/token_chooser.hpp's decision: 'one_thread', 'pooled' or 'split'.
    """
def choose_work(params: fastpar._core.GenerateParams, n_logits: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Work units of choosing from a row of n_logits with these params.
    """
def compare_masks(model: fastpar._core.Model, params: fastpar._core.GenerateParams, steps: typing.SupportsInt | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex, workers: typing.SupportsInt | typing.SupportsIndex = 0) -> dict:
    """
    Whole masks of the allowed-token sets against llama.cpp's, along a random walk (testing/probes.hpp).
    """
def cpus_within(n_affinity: typing.SupportsInt | typing.SupportsIndex, quota: typing.SupportsFloat | typing.SupportsIndex) -> int:
    """
    Threads for an affinity mask of n_affinity CPUs and a quota (core/threads/cpus.hpp).
    """
def device_serves(params: fastpar._core.GenerateParams) -> bool:
    """
    Whether device sampling may cut this request's rows down (DeviceSampling::serves).
    """
def engine_with_policy(model: fastpar._core.Model, params: fastpar._core.ContextParams, max_queued: typing.SupportsInt | typing.SupportsIndex, policy: StepPolicy) -> fastpar._core.Engine:
    """
    A fastpar._core.Engine whose worker runs with `policy` as it is (a GPU's rules on a CPU).
    """
def fail_engine_worker(engine: fastpar._core.Engine, message: str) -> None:
    """
    For tests: the engine's worker throws Error(message) between two steps, as a failing step would (Engine::post).
    """
def generate_with_policy(ctx: fastpar._core.Context, prompts: collections.abc.Sequence[str], params: collections.abc.Sequence[fastpar._core.GenerateParams], policy: StepPolicy) -> list[fastpar._core.Completion]:
    """
    Context.generate of text prompts with another step policy than the context's (a GPU's rules on a CPU).
    """
def measure_grammar(model: fastpar._core.Model, params: fastpar._core.GenerateParams, tokens: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> dict:
    """
    What a json_schema or grammar constraint costs (testing/probes.hpp, measure_grammar).
    """
def plan_step(slots: collections.abc.Sequence[PlanInput], policy: StepPolicy, n_batch: typing.SupportsInt | typing.SupportsIndex, decode_waits: typing.SupportsInt | typing.SupportsIndex = 0) -> dict:
    """
    core/loop/step_plan.hpp's plan_step: a dict of n_plan, pad and n_pad_tokens per slot, decode_waits, prompts_first, n_tokens.
    """
def resolve_step_policy(output_on_gpu: bool, kv_unified: bool, memory_copies_by_position: bool, share_prefixes: bool, n_parallel: typing.SupportsInt | typing.SupportsIndex, n_threads: typing.SupportsInt | typing.SupportsIndex) -> StepPolicy:
    ...
def rows_split(params: fastpar._core.GenerateParams, n_logits: typing.SupportsInt | typing.SupportsIndex, device_blocks: bool = False) -> bool:
    """
    core/sampling/sampling.hpp's splits(): whether a row of n_logits may be split over threads.
    """
def sample_against_llama(params: fastpar._core.GenerateParams, seed: typing.SupportsInt | typing.SupportsIndex, logits: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], blocks: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], width: typing.SupportsInt | typing.SupportsIndex, draws: typing.SupportsInt | typing.SupportsIndex, split_rows: typing.SupportsInt | typing.SupportsIndex = 0, pool_workers: typing.SupportsInt | typing.SupportsIndex = 0) -> tuple[list[int], list[int]]:
    """
    Tokens fastpar's host sampling picks next to those llama.cpp's own chain picks (testing/probes.hpp, sample_against_llama).
    """
def set_allowed_sets(ctx: fastpar._core.Context, on: bool) -> None:
    """
    Whether ctx's constrained rows share allowed-token sets by grammar state (its grammar cache's
    option, on by default; read when a call starts a constrained request). Off: each refusal masks
    with the row's grammar alone, the oracle the sets are compared with.
    """
def set_cache_selective(ctx: fastpar._core.Context, on: bool) -> None:
    """
    Whether ctx's prefix cache saves sequences to host memory only while saved or unsaved ones are
    reused, as it does with its KV cache in GPU memory (ValueError without a cache).
    """
def streaming_step_policy(policy: StepPolicy) -> StepPolicy:
    """
    An Engine's step policy over its context's (core/loop/step_policy.hpp).
    """
def stress_task_pool(n_workers: typing.SupportsInt | typing.SupportsIndex, runs: typing.SupportsInt | typing.SupportsIndex, caller_spin_us: typing.SupportsInt | typing.SupportsIndex = 0, anticipate_us: typing.SupportsInt | typing.SupportsIndex = 0) -> int:
    """
    Runs that broke the sampling pool's contract (testing.cpp, stress_task_pool).
    """
def thread_governor_decide(threads: typing.SupportsInt | typing.SupportsIndex, max_threads: typing.SupportsInt | typing.SupportsIndex, waited: typing.SupportsFloat | typing.SupportsIndex, since_change_s: typing.SupportsFloat | typing.SupportsIndex) -> int:
    """
    ThreadGovernor's rule on one window (core/threads/thread_governor.hpp): the next thread count.
    """
CHUNK_PADDING_PER_PASS: int = 256
MAX_PADDED_GAP_GPU: int = 32
MIN_POOLED: int = 8
MIN_POOLED_WORK: int = 262144
MIN_SHARED_PREFIX: int = 16
MIN_SPLIT: int = 2
REFILL_WAVE_DIVISOR: int = 8
STREAMING_DECODE_WAITS: int = 3
STREAMING_WAVE_HOLD: int = 8
UNLIMITED_DECODE_WAITS: int = 2147483647
UNLIMITED_WAVE_HOLD: int = 9223372036854775807
cpu_batch: int = 512
gpu_batch: int = 2048
