"""Type stub of fastpar's test and benchmark hooks (csrc/python/testing.cpp); not part of the API."""

from typing import Dict, List, Sequence, Tuple, Union

from ._core import Engine, GenerateParams

MAX_PADDED_GAP_GPU: int
STREAMING_DECODE_WAITS: int
UNLIMITED_DECODE_WAITS: int
MIN_SHARED_PREFIX: int
MIN_POOLED: int
MIN_POOLED_WORK: int
MIN_SPLIT: int
cpu_batch: int
gpu_batch: int

class StepPolicy:
    max_padded_gap: int
    prompts_first: bool
    max_decode_waits: int
    split_rows: bool
    share_prefixes: bool
    @property
    def pool_anticipate_us(self) -> int: ...
    @property
    def pool_caller_spin_us(self) -> int: ...
    def __init__(self) -> None: ...

def resolve_step_policy(
    output_on_gpu: bool, kv_unified: bool, memory_copies_by_position: bool, share_prefixes: bool, n_parallel: int,
    n_threads: int,
) -> StepPolicy: ...

class SlotState:
    active: bool
    prefilling: bool
    waiting: bool
    left: int
    def __init__(self, active: bool = False, prefilling: bool = False, waiting: bool = False, left: int = 0) -> None: ...

def plan_step(
    slots: Sequence[SlotState], policy: StepPolicy, n_batch: int, rotation: int = 0, decode_waits: int = 0
) -> Dict[str, Union[List[int], List[bool], int, bool]]: ...

class SharingSlot:
    active: bool
    n_fed: int
    prompt_size: int
    @property
    def waiting(self) -> bool: ...
    @property
    def copied(self) -> bool: ...
    @property
    def donor(self) -> int: ...
    def __init__(self, active: bool = False, n_fed: int = 0, prompt_size: int = 0) -> None: ...

class PrefixSharing:
    def __init__(self, n_slots: int, min_shared: int = ...) -> None: ...
    def pair_up(self, a: int, prompt_a: List[int], b: int, prompt_b: List[int]) -> None: ...
    def common(self, a: int, b: int) -> int: ...
    def decide(self, slots: Sequence[SharingSlot]) -> List[SharingSlot]: ...

class TextStream:
    def __init__(self, streaming: bool = True) -> None: ...
    def append(self, piece: bytes, stops: List[str] = ...) -> bool: ...
    def next_piece(self, stops: List[str] = ..., final: bool = False) -> str: ...
    def take_text(self) -> str: ...
    @property
    def bytes(self) -> bytes: ...

def choose_way(n_rows: int, work: int, have_pool: bool, split_rows: bool, rows_split: bool) -> str: ...
def choose_work(params: GenerateParams, n_logits: int) -> int: ...
def rows_split(params: GenerateParams, n_logits: int, device_blocks: bool = False) -> bool: ...
def sample_against_llama(
    params: GenerateParams,
    seed: int,
    logits: List[float],
    blocks: List[int],
    width: int,
    draws: int,
    split_rows: int = 0,
    pool_workers: int = 0,
) -> Tuple[List[int], List[int]]: ...
def stress_task_pool(n_workers: int, runs: int, caller_spin_us: int = 0, anticipate_us: int = 0) -> int: ...

def fail_engine_worker(engine: Engine, message: str) -> None: ...
