"""The serving tests' default ``server``: the tiny model's shared ``AsyncLLM`` behind a uvicorn
server on loopback, warmed by one request. A module that needs other settings or another
engine defines its own ``server`` (which overrides this one); ``http`` and ``oai``
(tests/conftest.py) are clients of whichever the module uses."""

from __future__ import annotations

import httpx
import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import ServerThread
from tests.serving.server_checks import PROMPT


@pytest.fixture(scope="module")
def server(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        warm = httpx.post(
            f"{running.url}/generate",
            timeout=120,
            json={"inputs": PROMPT, "parameters": {"max_new_tokens": 4}},
        )
        assert warm.status_code == 200, warm.text
        yield running
