"""``jaxgen run-batch``: OpenAI batch files through the server's app in process. One result line
per input line (bad ones get an error line), resumable, on the tiny model's shared engine."""

from __future__ import annotations

import asyncio
import json

from serving.launch.run_batch import main, run_batch_async
from serving.settings.resolve import ServerSettings

BAD_LINES = [
    "{not json",
    json.dumps({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}),
    json.dumps({"custom_id": "bad-method", "method": "GET", "url": "/v1/completions", "body": {}}),
    json.dumps({"custom_id": "bad-url", "url": "/v1/embeddings", "body": {"input": "x"}}),
    json.dumps({"custom_id": "bad-body", "url": "/v1/completions", "body": [1]}),
    json.dumps(
        {
            "custom_id": "bad-stream",
            "url": "/v1/completions",
            "body": {"prompt": "x", "stream": True},
        }
    ),
    json.dumps(
        {
            "custom_id": "bad-max",
            "url": "/v1/completions",
            "body": {"prompt": "x", "max_tokens": -1},
        }
    ),
    json.dumps(
        {"custom_id": "bad-messages", "url": "/v1/chat/completions", "body": {"messages": []}}
    ),
    json.dumps({"custom_id": "bad-input", "url": "/v1/responses", "body": {"input": 5}}),
    json.dumps(
        {
            "custom_id": "bad-model",
            "url": "/v1/completions",
            "body": {"model": "gpt-9", "prompt": "x"},
        }
    ),
]


def good_line(i: int) -> str:
    """A chat, completion or responses request (one token each: the batch runner is tested,
    not the engine)."""
    kind = i % 3
    if kind == 0:
        url = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 1}
    elif kind == 1:
        url, body = "/v1/completions", {"prompt": f"Count to {i}", "max_tokens": 1}
    else:
        url, body = "/v1/responses", {"input": f"Say {i}", "max_output_tokens": 1}
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body})


def test_run_batch_mixed_lines_and_resume(llm, tiny_model_dir, tmp_path):
    lines = [good_line(i) for i in range(190)]
    for k, bad in enumerate(BAD_LINES):
        lines.insert(k * 19 + 5, bad)
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(lines) + "\n")
    results = tmp_path / "results.jsonl"
    settings = ServerSettings(model=tiny_model_dir)

    def run():
        return asyncio.run(
            run_batch_async(llm, settings, str(requests), str(results), progress=False)
        )

    summary = run()
    assert (summary.requests, summary.errors, summary.skipped) == (200, 10, 0)
    assert summary.completion_tokens == 190
    out = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(out) == 200
    ids = [o["custom_id"] for o in out if o["custom_id"] is not None]
    assert len(ids) == len(set(ids)) == 198  # two bad lines have no custom_id
    by_id = {o["custom_id"]: o for o in out}
    for i in range(190):
        result = by_id[f"req-{i}"]
        assert result["error"] is None and result["response"]["status_code"] == 200
        assert result["id"].startswith("batch_req_")
    assert by_id["req-0"]["response"]["body"]["object"] == "chat.completion"
    assert by_id["req-2"]["response"]["body"]["object"] == "response"
    assert by_id["bad-max"]["response"]["status_code"] == 400
    assert by_id["bad-max"]["response"]["body"]["error"]["param"] == "max_tokens"
    assert by_id["bad-model"]["response"]["status_code"] == 404
    assert by_id["bad-url"]["response"] is None and "url" in by_id["bad-url"]["error"]["message"]
    assert by_id["bad-stream"]["error"]["code"] == "invalid_request"
    assert sorted(o["line"] for o in out if o["custom_id"] is None) == [6, 25]
    # A second run with the output present does nothing.
    again = run()
    assert (again.requests, again.skipped) == (0, 200)
    assert len(results.read_text().splitlines()) == 200
    # A run cut short resumes: drop some results (and cut the last line), run again.
    kept = results.read_text().splitlines()[:190]
    results.write_text("\n".join(kept) + "\n" + kept[-1][:10])
    resumed = run()
    assert resumed.requests == 10 and resumed.skipped == 190
    final = [json.loads(line) for line in results.read_text().splitlines()[191:]]  # past the cut
    keys = {o["custom_id"] or o["line"] for o in final}
    keys |= {json.loads(line)["custom_id"] or json.loads(line)["line"] for line in kept}
    assert len(final) == 10 and len(keys) == 200


def test_cli_refuses_missing_input(tmp_path, capsys):
    code = main(
        [
            "-i",
            str(tmp_path / "none.jsonl"),
            "-o",
            str(tmp_path / "o.jsonl"),
            "--max-concurrency",
            "0",
        ]
    )
    assert code == 2 and "--max-concurrency" in capsys.readouterr().err
