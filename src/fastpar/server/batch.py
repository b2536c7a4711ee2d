"""``fastpar run``: a file of requests in OpenAI's batch input format, answered in its
batch output format through ``generate_parallel``.

Each input line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" or
"/v1/completions", "body": {...}}``, or, with an embeddings context (``fastpar run
--embeddings``), ``"url": "/v1/embeddings"`` (``fastpar.embed``); a line of the other kind
fails with a message saying which option answers it, and a rerun with it does. Each output line is ``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``, written and flushed as soon as that
line's prompts are done, so an interrupted run loses nothing it finished. The output holds
one record per line: a rerun skips the ``custom_id``s answered (status 200) and tries the
failed lines again, first rewriting the output without their records. A line that cannot
be read becomes that line's error (``response: null``), never the file's. A line is
written only once it is finished: one cut short by an interrupt (Ctrl-C cancels the
``generate_parallel`` call) is left for the rerun.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from typing import Any, Dict, Iterator, List, Optional, Set, TextIO, Tuple

import fastpar

from .embeddings import embeddings_body, parse_embeddings
from .reasoning import thinks
from .protocol import APIError, Parsed, failure, parse, response_body

URLS = {"/v1/chat/completions": True, "/v1/completions": False}
EMBEDDINGS_URL = "/v1/embeddings"
#: Lines given to one generate_parallel call: enough to keep every slot busy, few enough
#: that the prompts of a huge file are not all held at once.
CHUNK_LINES = 2048


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``run_batch``; ``counts`` as it returns them, the unfinished lines
    (none of them written) in ``left``."""

    def __init__(self, counts: Dict[str, int]) -> None:
        super().__init__()
        self.counts = counts


class _Line:
    def __init__(self, number: int, custom_id: Optional[str], req: Optional[Parsed], error: Optional[str],
                 embed: Optional[Tuple[List[Any], str, Optional[str]]] = None) -> None:
        self.number, self.custom_id, self.req, self.error = number, custom_id, req, error
        self.embed = embed  # an embeddings line: its texts, encoding_format and model


def _key(custom_id: Optional[str], number: int) -> str:
    # A line without a usable custom_id is known by its line number, so that a rerun does
    # not report its error twice.
    return f"custom_id:{custom_id}" if custom_id is not None else f"line:{number}"


def _answered(rec: Any) -> bool:
    response = rec.get("response")
    return rec.get("error") is None and isinstance(response, dict) and response.get("status_code") == 200


def _read_done(path: str) -> Set[str]:
    """The keys of the lines an earlier run answered. Drops a last line cut short (killed
    in the middle of a write) and the records of failed lines, which this run tries again:
    the output is rewritten without them (a new file put in its place, so that a crash
    meanwhile leaves the old one whole)."""
    done: Set[str] = set()
    if not os.path.exists(path):
        return done
    with open(path, "rb") as f:
        data = f.read()
    end = data.rfind(b"\n") + 1
    keep: List[bytes] = []
    for raw in data[:end].splitlines(keepends=True):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # not a record of ours: dropped
        if isinstance(rec, dict) and _answered(rec) and isinstance(rec.get("custom_id"), str):
            done.add(_key(rec["custom_id"], -1))
            keep.append(raw)
    if len(keep) != data.count(b"\n") or end != len(data):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.writelines(keep)
            f.flush()
            os.fsync(f.fileno())
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    return done


def _parse_line(number: int, raw: str, n_ctx_per_seq: int, seen: Set[str], name: str, embedding_size: int = 0,
                model_thinks: bool = False) -> _Line:
    where = f"line {number} of {name}"
    try:
        rec = json.loads(raw)
    except json.JSONDecodeError as e:
        # The line alone was parsed: its column, not the parser's "line 1" (or "line 2" for
        # a line cut short), which would read as a line of the file.
        return _Line(number, None, None, f"{where} is not valid JSON: {e.msg} at column {e.colno}")
    if not isinstance(rec, dict):
        return _Line(number, None, None, f"{where} is not a JSON object")
    custom_id = rec.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _Line(number, None, None, f"{where} has no 'custom_id' string")
    if _key(custom_id, number) in seen:
        return _Line(number, None, None, f"{where} repeats custom_id {custom_id!r}")
    url = rec.get("url")
    if url not in URLS and url != EMBEDDINGS_URL:
        return _Line(number, custom_id, None,
                     f"'url' must be one of {', '.join(URLS)}, {EMBEDDINGS_URL}, got {url!r}")
    if rec.get("method", "POST") != "POST":
        return _Line(number, custom_id, None, f"'method' must be POST, got {rec.get('method')!r}")
    if (url == EMBEDDINGS_URL) != (embedding_size > 0):
        return _Line(number, custom_id, None, "an embeddings line: run with --embeddings to answer it"
                     if url == EMBEDDINGS_URL else "a generation line: run without --embeddings to answer it")
    if url == EMBEDDINGS_URL:
        try:
            texts, fmt = parse_embeddings(rec.get("body"), embedding_size)
        except APIError as e:
            return _Line(number, custom_id, None, e.message)
        return _Line(number, custom_id, None, None, (texts, fmt, rec["body"].get("model")))
    try:
        req = parse(rec.get("body"), URLS[url], n_ctx_per_seq, thinks=URLS[url] and model_thinks)
    except APIError as e:
        return _Line(number, custom_id, None, e.message)
    if req.stream:
        return _Line(number, custom_id, None, "'stream' is not available in a batch")
    return _Line(number, custom_id, req, None)


def _lines(path: str) -> Iterator[Tuple[int, str]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                yield number, raw.rstrip("\r\n")


def run_batch(ctx: fastpar.Context, input_path: str, output_path: str, *, limit: Optional[int] = None,
              progress: bool = True, model_name: str = "fastpar") -> Dict[str, int]:
    """Answers every line of ``input_path`` not yet answered in ``output_path`` (appending
    to it; the records of failed lines are dropped and those lines tried again); ``limit``:
    at most that many lines this time. Returns counts: answered (status 200), failed (an
    error, a status other than 200), skipped (answered before), left (not done: beyond
    ``limit``). Ctrl-C raises ``BatchInterrupted`` holding the counts so far; the lines it
    cut short are not written."""
    done = _read_done(output_path)
    counts = {"answered": 0, "failed": 0, "skipped": 0, "left": 0}
    todo: List[_Line] = []
    seen: Set[str] = set()
    name = os.path.basename(input_path)
    for number, raw in _lines(input_path):
        line = _parse_line(number, raw, ctx.n_ctx_per_seq, seen, name, ctx.embedding_size if ctx.embeddings else 0,
                           thinks(ctx.model))
        key = _key(line.custom_id, line.number)
        if key in done:
            counts["skipped"] += 1
            continue
        seen.add(key)
        if limit is not None and len(todo) >= limit:
            counts["left"] += 1
            continue
        todo.append(line)
    counts["left"] += len(todo)
    try:
        _answer(ctx, todo, output_path, counts, progress, model_name)
    except KeyboardInterrupt:
        raise BatchInterrupted(counts) from None
    return counts


def _answer(ctx: fastpar.Context, todo: List[_Line], output_path: str, counts: Dict[str, int], progress: bool,
            model_name: str) -> None:
    from tqdm.auto import tqdm

    with open(output_path, "a", encoding="utf-8") as out, \
            tqdm(total=len(todo), unit="line", desc="fastpar run", disable=not progress) as bar:
        def write(line: _Line, status: Optional[int], body: Optional[Dict[str, Any]], error: Optional[str]) -> None:
            rec: Dict[str, Any] = {"id": "batch_req_" + secrets.token_hex(12), "custom_id": line.custom_id,
                                   "response": None, "error": None}
            if error is not None:
                rec["error"] = {"code": "invalid_request", "message": error, "line": line.number}
            else:
                rec["response"] = {"status_code": status, "request_id": "req_" + secrets.token_hex(12),
                                   "body": body}
            _write(out, rec)
            counts["answered" if status == 200 else "failed"] += 1
            counts["left"] -= 1
            bar.update(1)

        for start in range(0, len(todo), CHUNK_LINES):
            chunk = todo[start:start + CHUNK_LINES]
            if ctx.embeddings:
                _embed_chunk(ctx, chunk, write, model_name)
                continue
            prompts: List[Any] = []
            params: List[fastpar.SamplingParams] = []
            owner: List[int] = []  # prompt -> index in chunk
            for i, line in enumerate(chunk):
                if line.req is None:
                    write(line, None, None, line.error)
                    continue
                try:
                    sp = line.req.sampling_params()
                except APIError as e:
                    write(line, None, None, e.message)
                    continue
                for p in line.req.prompts:
                    prompts.append(p)
                    params.append(sp)
                    owner.append(i)
            if not prompts:
                continue
            first: Dict[int, int] = {}
            for k, i in enumerate(owner):
                first.setdefault(i, k)
            results: List[Any] = [None] * len(prompts)  # each prompt's samples
            left: Dict[int, int] = {}
            for i in owner:
                left[i] = left.get(i, 0) + 1

            def on_completion(k: int, result: Any) -> None:
                # A Completion, or a prompt's list of samples when some line asks for n > 1.
                results[k] = result if isinstance(result, list) else [result]
                i = owner[k]
                left[i] -= 1
                if left[i]:
                    return
                line = chunk[i]
                completions = [c for r in results[first[i]:first[i] + len(line.req.prompts)] for c in r]
                if any(c.finish_reason == "cancelled" for c in completions):
                    return  # cut short (Ctrl-C): not an answer, left for the rerun
                err = next((e for e in (failure(c, line.req.choice_param(k)) for k, c in enumerate(completions))
                            if e is not None), None)
                if err is not None:
                    write(line, err.status, err.body(), None)
                else:
                    rid = ("chatcmpl-" if line.req.chat else "cmpl-") + secrets.token_hex(12)
                    write(line, 200, response_body(line.req, rid, int(time.time()), line.req.model or model_name,
                                                   completions, ctx.model), None)

            fastpar.generate_parallel(ctx, prompts, params, on_completion=on_completion)


def _embed_chunk(ctx: fastpar.Context, chunk: List[_Line], write: Any, model_name: str) -> None:
    """An embeddings run's lines: every text of the chunk in one ``fastpar.embed`` call, each
    line written as soon as its texts are done."""
    texts: List[Any] = []
    owner: List[int] = []
    for i, line in enumerate(chunk):
        if line.embed is None:
            write(line, None, None, line.error)
            continue
        texts.extend(line.embed[0])
        owner.extend([i] * len(line.embed[0]))
    if not texts:
        return
    done: List[Any] = [None] * len(texts)
    first: Dict[int, int] = {}
    left: Dict[int, int] = {}
    for k, i in enumerate(owner):
        first.setdefault(i, k)
        left[i] = left.get(i, 0) + 1

    def on_completion(k: int, completion: Any) -> None:
        done[k] = completion
        i = owner[k]
        left[i] -= 1
        if left[i]:
            return
        line = chunk[i]
        texts_of_line, fmt, model = line.embed
        try:
            status, body = embeddings_body(done[first[i]:first[i] + len(texts_of_line)], fmt, model or model_name)
        except APIError as e:
            write(line, e.status, e.body(), None)
            return
        write(line, status, body, None)

    fastpar.embed(ctx, texts, on_completion=on_completion)


def _write(out: TextIO, rec: Dict[str, Any]) -> None:
    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    out.flush()
