"""fastpar on Ray Data: one fastpar engine per actor, in the shape of ``ray.data.llm``.

    import ray
    import fastpar
    from fastpar.ray import FastparProcessorConfig, build_processor

    # 1 actor of 2 CPUs: Ray must find concurrency x num_cpus free CPUs, or the job waits
    config = FastparProcessorConfig(fastpar.default_model_path(), n_parallel=8, num_cpus=2, concurrency=1)
    processor = build_processor(config, preprocess=lambda row: {
        "messages": [{"role": "user", "content": row["question"]}],
        "sampling_params": {"temperature": 0.0, "max_tokens": 64}})
    ds = processor(ray.data.from_items([{"question": "What is the capital of France?"}]))
    print(ds.take_all())   # each row + generated_text, finish_reason, ...

Needs the optional extra: ``pip install 'fastpar[ray]'`` (Python 3.10+). docs/ray.md
describes the columns, the errors and the shape of ``n > 1``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

try:
    import ray
    import ray.data
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError("fastpar.ray needs Ray Data: pip install 'fastpar[ray]' (Python 3.10+) "
                      f"(importing ray failed: {_e})") from _e

import fastpar
from fastpar import SamplingParams

__all__ = ["ERROR_COLUMN", "FastparPredictor", "FastparProcessor", "FastparProcessorConfig", "build_processor"]

#: Ray's own name for the per-row error column (empty string on success), so code written
#: for ``ray.data.llm`` reads fastpar's rows unchanged.
ERROR_COLUMN = "__inference_error__"

_SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))
# The engine's own defaults, from its signature: the config's are the same.
_ENGINE_DEFAULTS = inspect.signature(fastpar.Engine).parameters
_INT_FIELDS = ("max_tokens", "top_k", "repeat_last_n", "seed", "top_logprobs", "n")


@dataclasses.dataclass(frozen=True)
class FastparProcessorConfig:
    """How each actor builds its engine, and how Ray Data feeds the actors.

    ``model_source``: a GGUF path readable on every node. ``n_parallel``, ``n_ctx_per_seq``,
    ``n_gpu_layers``: the engine's (``fastpar.Engine``). ``num_cpus``/``num_gpus``: each
    actor's Ray resources; the engine decodes with ``num_cpus`` threads (at least one).
    ``concurrency``: an int n is a fixed pool of n actors, a tuple (m, n) an autoscaling
    pool. ``batch_size`` rows per batch; ``max_concurrent_batches`` batches in flight per
    actor, all feeding one engine. ``apply_chat_template``: rows with ``messages`` are
    rendered with the model's template (else such rows fail). ``should_continue_on_error``:
    a failing row gets its message in ``__inference_error__`` instead of failing the job.
    ``sampling_params``: defaults (a dict of ``fastpar.SamplingParams`` fields, or one
    ``SamplingParams``) that each row's ``sampling_params`` overrides field by field; its
    ``n`` decides the output shape (``n > 1``: list columns, docs/ray.md).
    ``prefix_cache_mib``: each engine's prefix cache (``fastpar.Engine``: 0 off, -1 auto, or
    a budget in MiB): rows whose prompts start alike (a few-shot prefix, a system prompt)
    reuse the KV of what the actor decoded before instead of decoding it again.
    ``task``: ``"generate"`` (default) or ``"embed"`` (``ray.data.llm``'s ``task_type``): each
    row's ``prompt`` (or ``messages``) becomes one vector in an ``embeddings`` column, through
    an embeddings engine pooling by ``pooling`` (``None``: the model's own; see
    ``fastpar.embed``); ``sampling_params`` does not apply there.
    ``check_model_source``: ``model_source`` must be a file on this machine (the driver),
    checked here (``FileNotFoundError``; a folder: ``ValueError``) rather than in every
    actor, where the error would be buried in Ray's log; a relative path is made absolute.
    ``False`` when the file exists only on the worker nodes (a driver without their
    storage, a Ray Client connection): the path goes to the actors as given.
    """

    model_source: str
    n_parallel: int = _ENGINE_DEFAULTS["n_parallel"].default
    n_ctx_per_seq: int = _ENGINE_DEFAULTS["n_ctx_per_seq"].default
    n_gpu_layers: int = 0
    num_cpus: float = 1
    num_gpus: float = 0
    concurrency: Union[int, Tuple[int, int]] = 1
    batch_size: int = 32
    max_concurrent_batches: int = 8
    apply_chat_template: bool = True
    should_continue_on_error: bool = True
    sampling_params: Optional[Mapping[str, Any]] = None
    prefix_cache_mib: int = _ENGINE_DEFAULTS["prefix_cache_mib"].default
    check_model_source: bool = True
    task: str = "generate"
    pooling: Optional[str] = None

    def __post_init__(self) -> None:
        source = self.model_source
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        if not isinstance(source, str) or not source:
            raise TypeError(f"model_source must be the path of a GGUF file, got {self.model_source!r}")
        if not isinstance(self.check_model_source, bool):
            raise TypeError(f"check_model_source must be a bool, got {self.check_model_source!r}")
        if self.check_model_source:
            # Each actor loads the model when it starts; a missing file would fail there,
            # once per actor, inside Ray's own output. Actors may not share the driver's
            # working directory, so they get the absolute path that was checked.
            if not os.path.isfile(source):
                what = "is not a file" if os.path.exists(source) else "does not exist"
                error = ValueError if os.path.exists(source) else FileNotFoundError
                raise error(f"model_source {source!r} {what} on this machine (the Ray driver). Give a GGUF path "
                            "every node can read; if the file exists only on the worker nodes, pass "
                            "check_model_source=False")
            source = os.path.abspath(source)
        object.__setattr__(self, "model_source", source)
        c = self.concurrency
        if isinstance(c, list):
            c = tuple(c)
            object.__setattr__(self, "concurrency", c)
        if isinstance(c, bool) or not (isinstance(c, int) or (isinstance(c, tuple) and len(c) == 2
                                                               and all(isinstance(x, int) for x in c))):
            raise TypeError(f"concurrency must be an int or a (min, max) tuple of ints, got {c!r}")
        if isinstance(c, int) and c < 1:
            raise ValueError(f"concurrency must be >= 1, got {c}")
        if isinstance(c, tuple) and not 1 <= c[0] <= c[1]:
            raise ValueError(f"concurrency (min, max) needs 1 <= min <= max, got {c}")
        for name in ("batch_size", "max_concurrent_batches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        v = self.prefix_cache_mib
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"prefix_cache_mib must be an int (0 off, -1 auto, or MiB), got {v!r}")
        if v < -1:
            raise ValueError(f"prefix_cache_mib must be -1 (auto), 0 (off) or a budget in MiB, got {v}")
        if not self.num_cpus > 0 or self.num_gpus < 0:
            raise ValueError(f"num_cpus must be > 0 and num_gpus >= 0, got {self.num_cpus} and {self.num_gpus}")
        if self.task not in ("generate", "embed"):
            raise ValueError(f"task must be 'generate' or 'embed', got {self.task!r}")
        if self.task == "embed" and self.sampling_params:
            raise ValueError("sampling_params does not apply to task='embed'")
        if self.pooling is not None and self.task != "embed":
            raise ValueError("pooling applies to task='embed'")
        if self.pooling not in (None, "mean", "cls", "last"):
            raise ValueError(f"pooling must be 'mean', 'cls', 'last' or None, got {self.pooling!r}")
        if self.task == "embed" and self.prefix_cache_mib > 0:
            raise ValueError("an embeddings engine keeps no prefix cache: leave prefix_cache_mib at 0")
        sp = self.sampling_params
        if isinstance(sp, SamplingParams):
            sp = {f: getattr(sp, f) for f in _SAMPLING_FIELDS}
        sp = dict(sp or {})
        SamplingParams(**sp)  # checked here, on the driver: TypeError / ValueError before any work
        object.__setattr__(self, "sampling_params", sp)

    @property
    def n(self) -> int:
        """Samples per row by default; above 1, every output column is a list (docs/ray.md)."""
        return int(self.sampling_params.get("n", 1))

    def _map_batches_kwargs(self) -> Dict[str, Any]:
        """The ``map_batches`` arguments the processor uses, as ``ray.data.llm`` sets them:
        an actor pool, and ``max_concurrent_batches`` calls (and blocks) in flight on each actor (the
        pool's ``max_concurrent_calls_per_actor`` where Ray has it, else the actor's
        ``max_concurrency``)."""
        c = self.concurrency
        pool: Dict[str, Any] = dict(size=c) if isinstance(c, int) else dict(min_size=c[0], max_size=c[1])
        # Blocks queued on an actor beyond what it runs: Ray's default (twice as many) lets
        # the first actor to start take every block of a small dataset before the others
        # are up; with as many as it runs, blocks go to whichever actor frees up.
        pool["max_tasks_in_flight_per_actor"] = self.max_concurrent_batches
        kwargs: Dict[str, Any] = dict(batch_size=self.batch_size, num_cpus=self.num_cpus)
        if "max_concurrent_calls_per_actor" in inspect.signature(ray.data.ActorPoolStrategy).parameters:
            pool["max_concurrent_calls_per_actor"] = self.max_concurrent_batches
        else:
            kwargs["max_concurrency"] = self.max_concurrent_batches
        kwargs["compute"] = ray.data.ActorPoolStrategy(**pool)
        if self.num_gpus:
            kwargs["num_gpus"] = self.num_gpus
        return kwargs


def _plain(value: Any) -> Any:
    """Arrow/numpy values of a row (numpy arrays, numpy scalars) as plain Python."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _drop_nulls(value: Any) -> Any:
    """Arrow gives every struct in a column the union of all rows' keys, missing ones as
    None: drop those so a row's dict is what the row gave (a schema's ``null`` values are
    lost too; pass ``json_schema`` as JSON text to keep them)."""
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


class _RowError(Exception):
    pass


class FastparPredictor:
    """A ``map_batches`` callable class: one ``fastpar.Model`` and one ``fastpar.Engine``
    per actor, made once. Use it directly when writing ``map_batches`` yourself::

        ds.map_batches(FastparPredictor, fn_constructor_kwargs={"config": config},
                       concurrency=2, num_cpus=1, batch_size=32)

    Each call submits every row of its batch to the engine at once and returns the batch
    with the output columns added (docs/ray.md). Calls from several threads (Ray's
    ``max_concurrency``) share the engine; ``build_processor`` uses the asyncio form."""

    def __init__(self, config: FastparProcessorConfig) -> None:
        if not isinstance(config, FastparProcessorConfig):
            raise TypeError(f"config must be a FastparProcessorConfig, got {type(config).__name__}")
        self.config = config
        self._setup(None, None)
        self.model = fastpar.Model(config.model_source, n_gpu_layers=config.n_gpu_layers)
        in_flight = config.batch_size * config.max_concurrent_batches * max(config.n, 1)
        self.embed = config.task == "embed"
        self.engine = fastpar.Engine(self.model, n_parallel=config.n_parallel, n_ctx_per_seq=config.n_ctx_per_seq,
                                     n_threads=max(1, int(round(config.num_cpus))),
                                     max_queued=max(1024, 4 * in_flight), prefix_cache_mib=config.prefix_cache_mib,
                                     embeddings=self.embed, pooling=config.pooling)

    # -- one row -------------------------------------------------------------------------

    def _row_request(self, row: Mapping[str, Any]) -> Tuple[Any, SamplingParams]:
        """The row's prompt and its SamplingParams (``n`` samples, sample j seeded seed + j
        by the engine, as generate_parallel seeds them); raises _RowError."""
        messages, prompt = row.get("messages"), row.get("prompt")
        if messages is not None:
            if not self.config.apply_chat_template:
                raise _RowError("the row has messages but apply_chat_template=False; give a prompt")
            prompt = _plain(messages)
        elif prompt is None:
            raise _RowError("the row has neither 'messages' nor 'prompt'")
        else:
            prompt = _plain(prompt)
        if self.embed:
            return prompt, None
        options = dict(self.config.sampling_params)
        row_sp = row.get("sampling_params")
        if row_sp is not None:
            row_sp = _drop_nulls(_plain(row_sp))
            if isinstance(row_sp, Mapping):  # numpy batches turn an int column with gaps into floats
                row_sp = {k: int(v) if k in _INT_FIELDS and isinstance(v, float) and v.is_integer() else v
                          for k, v in row_sp.items()}
            if not isinstance(row_sp, Mapping):
                raise _RowError(f"sampling_params must be a dict of SamplingParams fields, got {type(row_sp).__name__}")
            unknown = sorted(set(row_sp) - set(_SAMPLING_FIELDS))
            if unknown:
                raise _RowError(f"sampling_params has unknown fields {unknown}; the fields are {list(_SAMPLING_FIELDS)}")
            options.update(row_sp)
        try:
            sp = SamplingParams(**options)
        except (TypeError, ValueError) as e:
            raise _RowError(f"{type(e).__name__}: {e}") from None
        if sp.n > 1 and self.config.n == 1:
            raise _RowError(f"the row asks n={sp.n} samples, but the processor's output columns are "
                            "single values; set sampling_params={'n': ...} in FastparProcessorConfig for list columns")
        return prompt, sp

    def _outputs(self, completions: Optional[List[fastpar.Completion]], params: Optional[SamplingParams],
                 error: str) -> Dict[str, Any]:
        """One row's output columns from its completions (one per sample), or its error."""
        if self.embed:
            return self._embed_outputs(completions, error)
        listed = self.config.n > 1
        out: Dict[str, Any] = {}
        if completions is None:
            k = 0
            texts, reasons, n_gen, n_in = [], [], [], 0
        else:
            failed = [c for c in completions if c.finish_reason in ("error", "cancelled")]
            if failed and not error:
                c = failed[0]
                error = c.error or f"the request ended as {c.finish_reason!r}"
            texts = [c.text for c in completions]
            reasons = [c.finish_reason for c in completions]
            n_gen = [c.n_gen_tokens for c in completions]
            c0 = completions[0]
            n_in = c0.n_prompt_tokens + c0.n_prompt_tokens_shared + c0.n_prompt_tokens_cached
            k = len(completions)
        if error and not self.config.should_continue_on_error:
            raise RuntimeError(f"fastpar: a row failed: {error}")
        if listed:
            out.update(generated_text=texts, finish_reason=reasons, num_generated_tokens=n_gen)
        else:
            out.update(generated_text=texts[0] if k else "", finish_reason=reasons[0] if k else "error",
                       num_generated_tokens=n_gen[0] if k else 0)
        out["num_input_tokens"] = n_in
        if completions is not None and params is not None:
            if params.logprobs:
                lp = [list(c.logprobs) for c in completions]
                out["logprobs"] = lp if listed else lp[0]
            if params.top_logprobs:
                top = [[[{"token_id": t, "text": s, "logprob": p} for (t, s, p) in pos] for pos in c.top_logprobs]
                       for c in completions]
                out["top_logprobs"] = top if listed else top[0]
            if params.reasoning == "split":
                thoughts = [c.reasoning for c in completions]
                out["reasoning"] = thoughts if listed else thoughts[0]
            if params.tools is not None:  # OpenAI's message tool_calls, one list per sample
                calls = [[{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                          for t in c.tool_calls] for c in completions]
                out["tool_calls"] = calls if listed else calls[0]
        out[ERROR_COLUMN] = error
        return out

    def _embed_outputs(self, completions: Optional[List[fastpar.Completion]], error: str) -> Dict[str, Any]:
        """An embed row's columns: its vector (``None`` when it failed), its tokens, its error."""
        c = completions[0] if completions else None
        if c is not None and c.finish_reason != "stop" and not error:
            error = c.error or f"the request ended as {c.finish_reason!r}"
        if error and not self.config.should_continue_on_error:
            raise RuntimeError(f"fastpar: a row failed: {error}")
        return {"embeddings": list(c.embedding) if c is not None and not error else None,
                "num_input_tokens": c.n_prompt_tokens if c is not None else 0, ERROR_COLUMN: error}

    # -- a batch -------------------------------------------------------------------------

    def _setup(self, preprocess: Optional[Callable], postprocess: Optional[Callable]) -> None:
        self.preprocess, self.postprocess = preprocess, postprocess

    def _rows(self, batch: Any) -> List[Dict[str, Any]]:
        """The batch's rows as plain dicts (an Arrow table, a pandas frame or numpy columns)."""
        if hasattr(batch, "to_pylist"):
            rows = batch.to_pylist()
        elif hasattr(batch, "to_dict") and hasattr(batch, "columns"):
            rows = batch.to_dict("records")
        else:
            columns = dict(batch)
            n = len(next(iter(columns.values()))) if columns else 0
            rows = [{c: v[i] for c, v in columns.items()} for i in range(n)]
        if self.preprocess is not None:
            rows = [{**row, **self.preprocess(row)} for row in rows]
        return rows

    def _finish(self, batch: Any, rows: List[Dict[str, Any]], outputs: List[Dict[str, Any]]) -> Any:
        """The output batch, in the input's format: the input columns as they came (to the
        type) plus the output columns; through ``postprocess`` when given (rows with an
        error skip it and keep every column, as in ``ray.data.llm``)."""
        if self.preprocess is None and self.postprocess is None:
            names: List[str] = []
            for o in outputs:
                names += [k for k in o if k not in names]
            added = {name: [o.get(name) for o in outputs] for name in names}
            if hasattr(batch, "append_column"):
                import pyarrow
                for name, values in added.items():
                    batch = batch.append_column(name, pyarrow.array(values))
                return batch
            if hasattr(batch, "to_dict") and hasattr(batch, "columns"):
                return batch.assign(**added)
            return {**dict(batch), **added}
        out_rows = []
        for row, o in zip(rows, outputs):
            row = {**row, **o}
            if self.postprocess is not None and not o[ERROR_COLUMN]:
                row = dict(self.postprocess(row))
                row.setdefault(ERROR_COLUMN, "")
            out_rows.append(row)
        names = []
        for r in out_rows:
            names += [k for k in r if k not in names]
        columns = {name: [r.get(name) for r in out_rows] for name in names}
        if hasattr(batch, "append_column"):
            import pyarrow
            return pyarrow.table({name: pyarrow.array(v) for name, v in columns.items()})
        if hasattr(batch, "to_dict") and hasattr(batch, "columns"):
            import pandas
            return pandas.DataFrame(columns)
        return columns

    def _prepare(self, rows: List[Dict[str, Any]]) -> List[Tuple[Any, Optional[SamplingParams], str]]:
        prepared = []
        for row in rows:
            try:
                prompt, params = self._row_request(row)
                prepared.append((prompt, params, ""))
            except _RowError as e:
                prepared.append((None, None, str(e)))
        return prepared

    def __call__(self, batch: Any) -> Any:
        rows = self._rows(batch)
        pending = []
        for prompt, params, error in self._prepare(rows):
            request = None
            if not error:
                try:
                    request = (self.engine.submit_embedding(prompt, block=True) if self.embed
                               else self.engine.submit(prompt, params, block=True))
                except (TypeError, ValueError) as e:
                    error = f"{type(e).__name__}: {e}"
            pending.append((request, params, error))
        outputs = [self._outputs(None if r is None else r.completions(), params, error)
                   for r, params, error in pending]
        return self._finish(batch, rows, outputs)

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


class _AsyncFastparPredictor(FastparPredictor):
    """The processor's actor: an asyncio ``__call__``, so Ray keeps
    ``max_concurrent_batches`` batches in flight on one event loop and the engine takes
    the next batch's rows while the last rows of the previous one finish. ``preprocess``
    and ``postprocess`` run here, in the actor, so that they take no CPUs of their own."""

    def __init__(self, config: FastparProcessorConfig, preprocess: Optional[Callable] = None,
                 postprocess: Optional[Callable] = None) -> None:
        super().__init__(config)
        self._setup(preprocess, postprocess)

    async def _one(self, prompt: Any, params: Optional[SamplingParams], error: str) -> Dict[str, Any]:
        completions = None
        if not error:
            try:
                completions = await self._agenerate(prompt, params)
            except (TypeError, ValueError) as e:
                error = f"{type(e).__name__}: {e}"
        return self._outputs(completions, params, error)

    async def _agenerate(self, prompt: Any, params: Optional[SamplingParams]) -> List[fastpar.Completion]:
        if self.embed:
            return [await self._aembed(prompt)]
        while True:
            try:
                result = await self.engine.agenerate(prompt, params)
            except fastpar.QueueFull:  # more in flight than max_queued: wait for room
                await asyncio.sleep(0.01)
                continue
            return result if isinstance(result, list) else [result]

    async def _aembed(self, prompt: Any) -> fastpar.Completion:
        """One text's completion (its vector and tokens), awaited without blocking the loop."""
        while True:
            try:
                request = self.engine.submit_embedding(prompt)
                break
            except fastpar.QueueFull:  # more in flight than max_queued: wait for room
                await asyncio.sleep(0.01)
        return await request.aresult()

    async def __call__(self, batch: Any) -> Any:  # type: ignore[override]
        rows = self._rows(batch)
        outputs = await asyncio.gather(*[self._one(*p) for p in self._prepare(rows)])
        return self._finish(batch, rows, list(outputs))


class FastparProcessor:
    """``processor(dataset) -> dataset``: one ``map_batches`` stage over an actor pool;
    each actor applies ``preprocess`` to its rows (merged into each row, as Ray's
    processors do), generates, and applies ``postprocess`` (rows with an error skip it and
    keep every column, as in ``ray.data.llm``)."""

    def __init__(self, config: FastparProcessorConfig, preprocess: Optional[Callable] = None,
                 postprocess: Optional[Callable] = None) -> None:
        self.config = config
        self.preprocess = preprocess
        self.postprocess = postprocess

    def __call__(self, dataset: "ray.data.Dataset") -> "ray.data.Dataset":
        return dataset.map_batches(_AsyncFastparPredictor, batch_format="pyarrow", zero_copy_batch=True,
                                   fn_constructor_kwargs=dict(config=self.config, preprocess=self.preprocess,
                                                              postprocess=self.postprocess),
                                   **self.config._map_batches_kwargs())


def build_processor(config: FastparProcessorConfig, preprocess: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
                    postprocess: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None) -> FastparProcessor:
    """A processor over ``config``, as ``ray.data.llm.build_processor`` makes one:
    ``preprocess(row)`` returns the columns to add (``messages`` or ``prompt``, optionally
    ``sampling_params``); ``postprocess(row)`` returns the output row."""
    if not isinstance(config, FastparProcessorConfig):
        raise TypeError(f"config must be a FastparProcessorConfig, got {type(config).__name__}")
    for name, fn in (("preprocess", preprocess), ("postprocess", postprocess)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable or None")
    return FastparProcessor(config, preprocess, postprocess)
