"""Models by hub id, downloaded for real through ``huggingface_hub`` from a loopback fake of
the hub (``tests.loaders.fake_hub``): what is fetched, what the downloaded model generates,
loading again from the cache with the network gone, and every bad input's message.

``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` once, at
import: in this process its ``constants`` are set (``hub_env``); ``test_cli_by_hub_id`` runs
the command line in a fresh process with the environment variables themselves.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.loaders import HubModelError, resolve_model
from serving.testing import TINY_ENGINE_KNOBS
from tests.family_models import save_family_model
from tests.loaders.fake_hub import FakeHub
from tests.loaders.test_gguf_families import write_gguf_like_llama_cpp

TOKEN = "hf_fake_token_of_the_owner"
PROMPTS = ["The capital of France is", "def fib(n):"]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
# The files of the tiny checkpoint directory that loading needs (all it holds).
NOT_NEEDED = {
    "pytorch_model.bin": b"pickled weights jaxgen never reads",
    "onnx/model.onnx": b"onnx",
    "original/consolidated.00.pth": b"pth",
    "README.md": b"# tiny",
}


def _read_dir(path: str) -> dict[str, bytes]:
    files = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            files[name] = f.read()
    return files


@pytest.fixture(scope="module")
def tiny_gguf(smollm2_tokenizer, smollm2_gguf, tmp_path_factory) -> str:
    """A tiny random Qwen3 as llama.cpp's converter writes it (float32)."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    hf_dir = save_family_model(str(folder / "hf"), smollm2_tokenizer, "qwen3")
    return write_gguf_like_llama_cpp(hf_dir, str(folder / "tiny-F32.gguf"), smollm2_gguf)


@pytest.fixture(scope="module")
def repositories(tiny_model_dir, tiny_gguf) -> dict:
    """repo id -> (files, options) the fake hub serves."""
    checkpoint = _read_dir(tiny_model_dir)
    with open(tiny_gguf, "rb") as f:
        gguf = f.read()
    return {
        "org/tiny": ({**checkpoint, **NOT_NEEDED}, {}),
        "org/tiny-GGUF": (
            {
                "tiny-F32.gguf": gguf,
                "tiny.Q8_0.gguf": gguf,  # the same bytes: which one is fetched is the check
                "tiny-Q2_K-00001-of-00002.gguf": b"part 1",
                "tiny-Q2_K-00002-of-00002.gguf": b"part 2",
                "mmproj-tiny-F16.gguf": b"vision projector",
                "README.md": b"# tiny GGUF",
            },
            {},
        ),
        "org/gated": (checkpoint, {"gated": True, "token": TOKEN}),
        "org/private": (checkpoint, {"private": True, "token": TOKEN}),
        "org/bin-only": (
            {"config.json": checkpoint["config.json"], "pytorch_model.bin": b"pickle"},
            {},
        ),
    }


@pytest.fixture
def fake_hub(repositories):
    hub = FakeHub()
    for repo_id, (files, options) in repositories.items():
        hub.add(repo_id, files, **options)
    config = repositories["org/tiny"][0]["config.json"].replace(b"{", b'{"v2": true, ', 1)
    hub.add("org/tiny", {**repositories["org/tiny"][0], "config.json": config}, ref="v2")
    hub.repos["org/tiny"].refs["main"] = next(iter(hub.repos["org/tiny"].commits))  # v1
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def hub_env(fake_hub, tmp_path, monkeypatch):
    """``huggingface_hub`` pointed at ``fake_hub``, online, with an empty cache and no token."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", fake_hub.url)
    template = fake_hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "stored_tokens"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    return constants


def _texts(llm: LLM) -> list[tuple[str, list[int]]]:
    return [(o.outputs[0].text, o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


def test_hub_checkpoint_generates_as_the_local_directory(
    hub_env, fake_hub, tiny_model_dir, monkeypatch
):
    xet_before = "hf_xet" in sys.modules
    downloaded = LLM("org/tiny", **TINY_ENGINE_KNOBS)
    path = downloaded.loaded.source
    assert path.startswith(hub_env.HF_HUB_CACHE)
    assert _texts(downloaded) == _texts(LLM(tiny_model_dir, **TINY_ENGINE_KNOBS))
    # Only what loading needs, and no Xet storage (the hub advertised none).
    assert fake_hub.downloaded() == sorted(os.listdir(tiny_model_dir))
    assert not any("xet" in url for _, url in fake_hub.requests)
    assert xet_before or "hf_xet" not in sys.modules

    fake_hub.stop()  # the network refused from here on
    requests = len(fake_hub.requests)
    monkeypatch.setattr(hub_env, "HF_HUB_OFFLINE", True)
    assert resolve_model("org/tiny") == path
    monkeypatch.setattr(hub_env, "HF_HUB_OFFLINE", False)  # unreachable: the cache, as hf does
    assert resolve_model("org/tiny") == path
    assert len(fake_hub.requests) == requests


def test_hub_gguf_by_tag_generates_as_the_local_file(hub_env, fake_hub, tiny_gguf):
    downloaded = LLM("org/tiny-GGUF:f32", **TINY_ENGINE_KNOBS)
    assert os.path.basename(downloaded.loaded.source) == "tiny-F32.gguf"
    assert _texts(downloaded) == _texts(LLM(tiny_gguf, **TINY_ENGINE_KNOBS))
    assert fake_hub.downloaded() == ["tiny-F32.gguf"]


def test_gguf_file_and_default_pick(hub_env, fake_hub):
    by_name = resolve_model("org/tiny-GGUF", gguf_file="tiny-F32.gguf")
    assert by_name == resolve_model("org/tiny-GGUF:F32")
    assert os.path.basename(resolve_model("org/tiny-GGUF")) == "tiny.Q8_0.gguf"  # llama.cpp's
    assert "mmproj-tiny-F16.gguf" not in fake_hub.downloaded()


def test_revision_branch_and_commit(hub_env, fake_hub, repositories):
    repo = fake_hub.repos["org/tiny"]
    v2 = resolve_model("org/tiny", revision="v2")
    assert v2.endswith(repo.refs["v2"])
    with open(os.path.join(v2, "config.json"), "rb") as f:
        assert f.read().startswith(b'{"v2": true')
    assert resolve_model("org/tiny", revision=repo.refs["main"]).endswith(repo.refs["main"])


def test_hub_config_only_downloads_config_json(hub_env, fake_hub):
    from jaxgen.loaders import model_config_only

    config = model_config_only("org/tiny")
    assert config.num_layers == 2
    assert fake_hub.downloaded() == ["config.json"]


def test_gated_repository_needs_a_token(hub_env, monkeypatch):
    with pytest.raises(HubModelError) as error:
        resolve_model("org/gated")
    assert str(error.value) == (
        "hub model 'org/gated' is gated (no HF_TOKEN is set): accept its conditions at "
        f"{hub_env.ENDPOINT}/org/gated and set HF_TOKEN to a token of that account (or log in "
        "with `hf auth login`)"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
    with pytest.raises(HubModelError, match=r"is gated \(HF_TOKEN is set\)"):
        resolve_model("org/gated")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert os.path.isfile(os.path.join(resolve_model("org/gated"), "model.safetensors"))


def test_private_repository_reads_as_missing_without_its_token(hub_env, monkeypatch):
    with pytest.raises(HubModelError, match="for a private repository set HF_TOKEN"):
        resolve_model("org/private")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert os.path.isdir(resolve_model("org/private"))


def test_unknown_repository(hub_env):
    with pytest.raises(HubModelError) as error:
        LLM("org/no-such-model")  # before anything loads
    assert str(error.value) == (
        "'org/no-such-model' is not a local path, and the hub has no repository "
        "'org/no-such-model' this client may read (no HF_TOKEN is set): check the name, or for "
        "a private repository set HF_TOKEN to a token that can read it; a local checkpoint "
        "directory or .gguf file is loaded by its path"
    )
    assert isinstance(error.value, ValueError)
    assert not os.path.exists(os.path.join(hub_env.HF_HUB_CACHE, "models--org--no-such-model"))


def test_unknown_revision(hub_env):
    with pytest.raises(HubModelError) as error:
        resolve_model("org/tiny", revision="no-such-branch")
    assert str(error.value) == (
        "hub repository 'org/tiny' has no revision 'no-such-branch' (revision / --revision: a "
        "branch, tag or commit of the repository)"
    )


def test_tag_without_a_file_and_split_gguf(hub_env, fake_hub):
    with pytest.raises(HubModelError, match=r"carries the quantisation tag 'Q4_K_M'; its tags: "):
        resolve_model("org/tiny-GGUF:Q4_K_M")
    with pytest.raises(HubModelError, match="split into 2 parts"):
        resolve_model("org/tiny-GGUF:Q2_K")
    assert fake_hub.downloaded() == []


def test_repository_without_loadable_weights(hub_env, fake_hub):
    with pytest.raises(HubModelError, match=r"neither a checkpoint jaxgen loads.*pytorch_model"):
        resolve_model("org/bin-only")
    assert fake_hub.downloaded() == []


def test_no_network_and_nothing_cached(hub_env, fake_hub):
    fake_hub.stop()
    with pytest.raises(HubModelError) as error:
        resolve_model("org/tiny")
    message = str(error.value)
    assert message.startswith(f"cannot reach the hub at {hub_env.ENDPOINT} for 'org/tiny' (")
    assert message.endswith(
        f"and it is not in the cache ({hub_env.HF_HUB_CACHE}): check the network (or "
        "HF_ENDPOINT), or give a local checkpoint directory or .gguf file; once it is "
        "downloaded, HF_HUB_OFFLINE=1 loads it from the cache without the network"
    )


def test_offline_and_nothing_cached(hub_env, monkeypatch):
    monkeypatch.setattr(hub_env, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubModelError) as error:
        resolve_model("org/tiny", revision="v2")
    assert str(error.value) == (
        "HF_HUB_OFFLINE=1 and hub model 'org/tiny' (revision 'v2') is not in the cache "
        f"({hub_env.HF_HUB_CACHE}): download it once with the network (HF_HUB_OFFLINE unset), "
        "point HF_HOME / HF_HUB_CACHE at the cache that holds it, or give a local checkpoint "
        "directory or .gguf file"
    )


def test_offline_with_part_of_the_checkpoint_cached(hub_env, fake_hub, monkeypatch):
    resolve_model("org/tiny", config_only=True)  # config.json only, as `jaxgen plan` fetches
    monkeypatch.setattr(hub_env, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubModelError, match=r"'org/tiny' is only partly in the cache"):
        resolve_model("org/tiny")


def test_local_paths_win_and_source_options_apply_to_hub_ids(tmp_path, tiny_model_dir):
    shaped = tmp_path / "org" / "name"
    shaped.mkdir(parents=True)
    os.chdir(tmp_path)  # "org/name" is now an existing relative path: a path, never a hub id
    try:
        assert resolve_model("org/name") == "org/name"
    finally:
        os.chdir(os.path.dirname(__file__))
    with pytest.raises(ValueError, match=r"revision='v2' applies to a hub id .* a local path"):
        resolve_model(tiny_model_dir, revision="v2")
    with pytest.raises(ValueError, match="applies to a hub id"):
        resolve_model(None, gguf_file="x.gguf")
    with pytest.raises(FileNotFoundError, match="not an existing local path.*nor a hub id"):
        resolve_model("/no/such/dir")


@pytest.mark.slow
def test_cli_by_hub_id(fake_hub, tiny_model_dir, tmp_path):
    """``jaxgen generate --model org/name`` in a process configured by the environment alone
    (HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE); a bad id exits 2 with one line, no traceback."""
    env = {
        **os.environ,
        "HF_ENDPOINT": fake_hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    env.pop("HF_TOKEN", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))

    def generate(model: str, **extra):
        argv = [sys.executable, "-m", "jaxgen", "generate", "--model", model, "--max-tokens", "6"]
        run = subprocess.run(
            argv + ["Hello"], cwd=root, env={**env, **extra}, capture_output=True, text=True
        )
        return run.returncode, run.stdout, run.stderr

    code, by_id, err = generate("org/tiny")
    assert code == 0, err
    assert os.path.isdir(tmp_path / "hf" / "hub" / "models--org--tiny")
    assert generate(tiny_model_dir)[1] == by_id
    fake_hub.stop()
    assert generate("org/tiny", HF_HUB_OFFLINE="1")[1] == by_id  # from the cache
    code, out, err = generate("org/no-such-model")
    assert code == 2 and out == ""
    assert err.startswith("jaxgen: error: 'org/no-such-model' is not a local path") or (
        err.startswith("jaxgen: error: cannot reach the hub")
    )
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_server_commands_download_before_serving(hub_env, fake_hub, tmp_path, capsys):
    """``jaxgen serve`` and ``jaxgen run-batch`` resolve the hub id before the server starts
    (or any request runs): a bad one ends the command with its message, exit code 2."""
    from serving.launch import cli, run_batch
    from serving.model_loading import fetch_model
    from serving.settings.resolve import resolve_settings

    settings = resolve_settings({"model": "org/tiny", "revision": "v2"}, {})
    fetched = fetch_model(settings)
    assert fetched.model_path.endswith(fake_hub.repos["org/tiny"].refs["v2"])
    assert fetched.model_name == "org/tiny"  # clients see the hub id, not the cache path
    assert resolve_settings({}, {"MODEL_ID": "org/tiny", "REVISION": "v2"}).revision == "v2"
    capsys.readouterr()  # the download's progress bars

    assert cli.main(["--model", "org/no-such-model"]) == 2
    assert capsys.readouterr().err.startswith(
        "jaxgen serve: error: 'org/no-such-model' is not a local path, and the hub has no "
    )
    requests = tmp_path / "requests.jsonl"
    requests.write_text("")
    argv = ["-i", str(requests), "-o", str(tmp_path / "out.jsonl"), "--no-progress"]
    assert run_batch.main([*argv, "--model", "org/tiny-GGUF:Q6_K"]) == 2
    assert capsys.readouterr().err == (
        "jaxgen run-batch: error: no GGUF file of hub repository 'org/tiny-GGUF' carries the "
        "quantisation tag 'Q6_K'; its tags: F32, Q2_K, Q8_0\n"
    )
