"""``jaxgen run-batch -i requests.jsonl -o results.jsonl``: OpenAI batch files, offline.

Each input line is an OpenAI batch request, ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions" | "/v1/completions" | "/v1/responses", "body"}``. Every request goes
through the server's own app in this process (the same checks, chat template, grammar
compiles and engine as ``jaxgen serve``, without a socket), all at once up to
``--max-concurrency``, so the engine runs at full batch. Each result is appended to the output as
soon as it is ready, in OpenAI's batch output format: ``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``; a request the API refuses keeps its status and
error body in ``response`` and has ``error`` set too, and a line that is not a request at all
(bad JSON, no ``custom_id``, another method or url, a stream) gets ``"response": null`` and an
``error``. No line is lost: every input line gets exactly one output line. The run is
resumable: requests whose ``custom_id`` is in the output already are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
import uuid

from serving.app import create_app
from serving.model_loading import build_llm
from serving.settings.flags import add_serve_arguments, check_engine_knobs, settings_from_args

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
DEFAULT_MAX_CONCURRENCY = 1024

logger = logging.getLogger("serving")


@dataclasses.dataclass
class BatchSummary:
    """What one run did."""

    requests: int = 0  # lines run this time
    skipped: int = 0  # lines whose custom_id was in the output already
    errors: int = 0  # lines that got an error
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (
            f"{self.requests} requests ({self.errors} errors, {self.skipped} already done), "
            f"{self.prompt_tokens} prompt + {self.completion_tokens} generated tokens in "
            f"{self.seconds:.1f} s: {self.tokens_per_second:.1f} generated tok/s"
        )


@dataclasses.dataclass
class BatchLine:
    """One input line: a request to run, or the error it gets."""

    number: int
    custom_id: str | None
    url: str | None = None
    body: dict | None = None
    error: str | None = None
    key: str = ""  # what marks it done in the output: its custom_id, else its line number


def read_lines(text_lines) -> list[BatchLine]:
    """Checks each non-blank input line (``BatchLine.error`` says what is wrong)."""
    lines, seen = [], set()
    for number, raw in enumerate(text_lines, start=1):
        if not raw.strip():
            continue
        lines.append(check_line(number, raw, seen))
    return lines


def check_line(number: int, raw: str, seen: set) -> BatchLine:
    try:
        request = json.loads(raw)
    except ValueError as error:
        return BatchLine(
            number, None, error=f"line {number} is not JSON: {error}", key=f"#{number}"
        )
    custom_id = request.get("custom_id") if isinstance(request, dict) else None
    if not isinstance(custom_id, str) or not custom_id:
        return BatchLine(
            number, None, error=f"line {number} has no `custom_id` string", key=f"#{number}"
        )
    line = BatchLine(number, custom_id, key=custom_id)
    if custom_id in seen:
        line.key = f"#{number}"
        line.error = f"`custom_id` {custom_id!r} repeats an earlier line's"
    elif request.get("method", "POST") != "POST":
        line.error = f"`method` must be POST, got {request.get('method')!r}"
    elif request.get("url") not in URLS:
        line.error = f"`url` must be one of {', '.join(URLS)}, got {request.get('url')!r}"
    elif not isinstance(request.get("body"), dict):
        line.error = "`body` must be a JSON object"
    elif request["body"].get("stream"):
        line.error = "`body.stream` is not supported in a batch"
    else:
        line.url, line.body = request["url"], request["body"]
    seen.add(custom_id)
    return line


def done_keys(path: str) -> set[str]:
    """The keys of the lines an earlier run wrote to ``path`` (none if it does not exist)."""
    keys = set()
    try:
        with open(path, encoding="utf-8") as handle:
            for raw in handle:
                try:
                    result = json.loads(raw)
                except ValueError:
                    continue  # a line cut by a crash: that request runs again
                if isinstance(result, dict):
                    custom_id = result.get("custom_id")
                    keys.add(custom_id if custom_id is not None else f"#{result.get('line')}")
    except FileNotFoundError:
        pass
    return keys


def ends_cut(path: str) -> bool:
    """Whether the file at ``path`` ends in the middle of a line."""
    try:
        with open(path, "rb") as handle:
            if handle.seek(0, 2) == 0:
                return False
            handle.seek(-1, 2)
            return handle.read(1) != b"\n"
    except FileNotFoundError:
        return False


async def call_app(app, url: str, body: dict) -> tuple[int, dict]:
    """POSTs ``body`` to the app in process (ASGI, no socket); returns status and JSON body."""
    payload = json.dumps(body).encode()
    sent = False
    never = asyncio.Event()

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await never.wait()  # the client never disconnects

    status, chunks = 500, []

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": url,
        "raw_path": url.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
    }
    await app(scope, receive, send)
    return status, json.loads(b"".join(chunks) or b"null")


def result_line(line: BatchLine, status: int | None, body) -> dict:
    """OpenAI's batch output line."""
    request_id = f"req_{uuid.uuid4().hex}"
    result = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id}
    if line.custom_id is None:
        result["line"] = line.number  # marks it done for a resumed run
    if status is None:
        result["response"] = None
        result["error"] = {"code": "invalid_request", "message": line.error}
        return result
    result["response"] = {"status_code": status, "request_id": request_id, "body": body}
    result["error"] = None
    if status != 200:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {"message": str(error)}
        result["error"] = {"code": str(error.get("code", status)), "message": error.get("message")}
    return result


def count_tokens(summary: BatchSummary, body) -> None:
    usage = body.get("usage") if isinstance(body, dict) else None
    if isinstance(usage, dict):
        summary.prompt_tokens += usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0
        summary.completion_tokens += (
            usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
        )


async def run_batch_async(
    llm,
    settings,
    input_path: str,
    output_path: str,
    *,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    progress: bool = True,
) -> BatchSummary:
    """Runs the input file's requests through the server app around ``llm`` (a running
    ``AsyncLLM``), appending each result to ``output_path``."""
    with open(input_path, encoding="utf-8") as handle:
        lines = read_lines(handle)
    done = done_keys(output_path)
    todo = [line for line in lines if line.key not in done]
    summary = BatchSummary(requests=len(todo), skipped=len(lines) - len(todo))
    if not todo:
        return summary
    settings = dataclasses.replace(
        settings, max_concurrent_requests=max(settings.max_concurrent_requests, max_concurrency)
    )
    app = create_app(llm, settings)
    limit = asyncio.Semaphore(max_concurrency)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="run-batch", unit="req")
    started = time.perf_counter()
    cut = ends_cut(output_path)
    with open(output_path, "a", encoding="utf-8") as output:
        if cut:  # a line cut by a crash: the next result starts a line of its own
            output.write("\n")

        async def run(line: BatchLine) -> None:
            status, body = None, None
            if line.error is None:
                async with limit:
                    try:
                        status, body = await call_app(app, line.url, line.body)
                    except Exception as error:  # never a lost line
                        status, body = 500, {"error": {"message": str(error), "code": 500}}
            result = result_line(line, status, body)
            if result["error"] is not None:
                summary.errors += 1
            else:
                count_tokens(summary, body)
            output.write(json.dumps(result, ensure_ascii=False) + "\n")
            output.flush()
            if bar is not None:
                bar.update(1)

        async with app.router.lifespan_context(app):
            await asyncio.gather(*(run(line) for line in todo))
    summary.seconds = time.perf_counter() - started
    if bar is not None:
        bar.close()
    return summary


def main(argv: list[str] | None = None) -> int:
    """``jaxgen run-batch`` (which runs ``python -m serving.launch.run_batch``)."""
    parser = argparse.ArgumentParser(prog="jaxgen run-batch", description=__doc__.split("\n")[0])
    parser.add_argument("-i", "--input-file", required=True, help="OpenAI batch requests (JSONL)")
    parser.add_argument("-o", "--output-file", required=True, help="results (JSONL, appended)")
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=DEFAULT_MAX_CONCURRENCY,
        help="requests in flight at once (the engine batches up to its own limit)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        if args.max_concurrency < 1:
            raise ValueError("--max-concurrency must be >= 1")
        settings = settings_from_args(args)
        check_engine_knobs(settings)
        logging.basicConfig(level=settings.log_level.upper())
        llm = build_llm(settings)
    except (ValueError, FileNotFoundError) as error:
        print(f"jaxgen run-batch: error: {error}", file=sys.stderr)
        return 2
    try:
        summary = asyncio.run(
            run_batch_async(
                llm,
                settings,
                args.input_file,
                args.output_file,
                max_concurrency=args.max_concurrency,
                progress=not args.no_progress,
            )
        )
    except FileNotFoundError as error:
        print(f"jaxgen run-batch: error: {error}", file=sys.stderr)
        return 2
    finally:
        llm.shutdown()
    print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
