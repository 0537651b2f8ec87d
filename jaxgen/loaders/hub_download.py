"""Models by hub id (``org/name``, ``org/name:Q4_K_M``): the files loading needs, downloaded
into the hub's cache through ``huggingface_hub`` (its progress bars, token, cache and offline
settings: ``HF_TOKEN``, ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_ENDPOINT``).

Nothing is downloaded but what ``jaxgen.loaders.hub_files`` chooses; every failure is a
``HubModelError`` saying what to do, raised before anything loads.
"""

from __future__ import annotations

import importlib
import json
import os
import re

from jaxgen.loaders.hub_files import INDEX_FILE, HubModelError, RepoFiles, choose_files

# ``org/name`` or ``org/name:TAG``: the shape of a hub id (the hub's own checks follow).
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<tag>[A-Za-z0-9_.-]+))?$")


def parse_hub_id(model: str) -> tuple[str, str | None] | None:
    """``(repo_id, tag)`` for a string shaped like a hub id (``org/name``, optionally
    ``:TAG``), else None. Whether it is an existing local path is the caller's question."""
    match = _HUB_ID.match(model)
    if match is None or ".." in model or "--" in match["repo"]:
        return None
    return match["repo"], match["tag"]


def download_model(
    repo_id: str,
    *,
    revision: str | None = None,
    gguf_file: str | None = None,
    tag: str | None = None,
    config_only: bool = False,
) -> str:
    """Downloads what loading ``repo_id`` needs (or finds it in the cache) and returns the
    local path: the snapshot directory of a safetensors checkpoint, or the GGUF file.

    Args:
        repo_id: ``org/name``.
        revision: a branch, tag or commit (default: the repository's main branch).
        gguf_file: a GGUF file of the repository to load.
        tag: a quantisation tag: the GGUF file whose name carries it (``Q4_K_M``).
        config_only: a checkpoint's ``config.json`` only (what ``jaxgen plan`` reads); a GGUF
            repository's file still comes whole (its metadata is the config).

    Raises:
        HubModelError: see ``jaxgen.loaders.hub_files`` and the module docstring.
    """
    hub = _Hub(repo_id, revision)
    files = choose_files(repo_id, hub.listing(), gguf_file=gguf_file, tag=tag)
    if files.gguf is not None:
        return os.path.join(hub.download([files.gguf]), files.gguf)
    folder = hub.download(["config.json"] if config_only else list(files.metadata))
    if not config_only:
        hub.download(_weights(files, folder, repo_id))
    return folder


class _Hub:
    """One repository at one revision through ``huggingface_hub``: its listing and downloads,
    from the cache alone once the hub is offline or unreachable (as ``huggingface_hub``
    itself falls back), every error explained."""

    def __init__(self, repo_id: str, revision: str | None):
        # Imported here: the ~0.2 s import is paid by a hub id only, never by a local model.
        try:
            import huggingface_hub
            from huggingface_hub import constants, errors
        except ImportError as error:  # a core dependency; a broken install is still possible
            raise HubModelError(
                f"loading a model by hub id needs huggingface_hub: pip install huggingface_hub "
                f"({error})"
            ) from None
        self.hub, self.constants, self.errors = huggingface_hub, constants, errors
        self.repo_id, self.revision = repo_id, revision
        self.offline = huggingface_hub.is_offline_mode()
        self.unreachable: Exception | None = None  # why the cache stands in for the hub

    def listing(self) -> list[str]:
        """Every file path of the repository at the revision (the cache's, offline)."""
        if not self.offline:
            try:
                info = self.hub.HfApi().model_info(self.repo_id, revision=self.revision)
                return [sibling.rfilename for sibling in info.siblings or []]
            except _transport_errors(self.hub) as error:
                self.unreachable = error
            except self.errors.HfHubHTTPError as error:
                raise self._http_error(error) from error
        try:
            folder = self.hub.snapshot_download(
                self.repo_id, revision=self.revision, local_files_only=True
            )
        except self.errors.IncompleteSnapshotError as error:
            folder = error.snapshot_path  # as expected: only the files loading needs are there
        except self.errors.LocalEntryNotFoundError as error:
            raise self._not_cached(error) from self.unreachable
        return self._cached_tree(folder)

    def _cached_tree(self, folder: str) -> list[str]:
        """The repository's listing the cache kept at the download (``huggingface_hub`` 2),
        so that offline the same files are chosen; else the files the snapshot holds."""
        cached_tree = getattr(self.hub, "get_cached_repo_tree", None)
        if cached_tree is not None:
            try:
                tree = cached_tree(self.repo_id, revision=self.revision)
                return [entry.path for entry in tree]
            except self.errors.CachedRepoTreeNotFoundError:
                pass
        return sorted(
            os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            for root, _, names in os.walk(folder)
            for name in names
        )

    def download(self, paths: list[str]) -> str:
        """``snapshot_download`` of exactly ``paths``: the snapshot directory."""
        local = self.offline or self.unreachable is not None
        try:
            return self.hub.snapshot_download(
                self.repo_id, revision=self.revision, allow_patterns=paths, local_files_only=local
            )
        except self.errors.LocalEntryNotFoundError as error:  # offline, or the network dropped
            if not local:
                self.unreachable = error
            raise self._not_cached(error) from error
        except self.errors.HfHubHTTPError as error:
            raise self._http_error(error) from error

    def _where(self) -> str:
        if self.revision is None:
            return repr(self.repo_id)
        return f"{self.repo_id!r} (revision {self.revision!r})"

    def _not_cached(self, error: Exception) -> HubModelError:
        cache = self.constants.HF_HUB_CACHE
        if isinstance(error, self.errors.IncompleteSnapshotError):
            state = f"is only partly in the cache ({cache})"
        else:
            state = f"is not in the cache ({cache})"
        if self.unreachable is None:
            return HubModelError(
                f"HF_HUB_OFFLINE=1 and hub model {self._where()} {state}: download it once with "
                "the network (HF_HUB_OFFLINE unset), point HF_HOME / HF_HUB_CACHE at the cache "
                "that holds it, or give a local checkpoint directory or .gguf file"
            )
        return HubModelError(
            f"cannot reach the hub at {self.constants.ENDPOINT} for {self._where()} "
            f"({type(self.unreachable).__name__}: {_first_line(self.unreachable)}), and it "
            f"{state}: check the network (or HF_ENDPOINT), or give a local checkpoint directory "
            "or .gguf file; once it is downloaded, HF_HUB_OFFLINE=1 loads it from the cache "
            "without the network"
        )

    def _http_error(self, error) -> HubModelError:
        errors, repo_id = self.errors, self.repo_id
        token = "HF_TOKEN is set" if self.hub.get_token() else "no HF_TOKEN is set"
        if isinstance(error, errors.GatedRepoError):
            return HubModelError(
                f"hub model {repo_id!r} is gated ({token}): accept its conditions at "
                f"{self.constants.ENDPOINT}/{repo_id} and set HF_TOKEN to a token of that "
                "account (or log in with `hf auth login`)"
            )
        if isinstance(error, errors.RepositoryNotFoundError):
            return HubModelError(
                f"{repo_id!r} is not a local path, and the hub has no repository {repo_id!r} "
                f"this client may read ({token}): check the name, or for a private repository "
                "set HF_TOKEN to a token that can read it; a local checkpoint directory or "
                ".gguf file is loaded by its path"
            )
        if isinstance(error, errors.RevisionNotFoundError):
            return HubModelError(
                f"hub repository {repo_id!r} has no revision {self.revision!r} (revision / "
                "--revision: a branch, tag or commit of the repository)"
            )
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403):
            return HubModelError(
                f"the hub refused {repo_id!r} (HTTP {status}, {token}): set HF_TOKEN to a valid "
                f"token that can read it ({_first_line(error)})"
            )
        return HubModelError(
            f"the hub failed for {self._where()} (HTTP {status}: {_first_line(error)}); try "
            "again later, or once it is downloaded set HF_HUB_OFFLINE=1 to load it from the cache"
        )


def _weights(files: RepoFiles, folder: str, repo_id: str) -> list[str]:
    """The weight files to download: as chosen, or the shards the downloaded index names."""
    if files.weights is not None:
        return list(files.weights)
    try:
        with open(os.path.join(folder, INDEX_FILE)) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise HubModelError(
            f"{INDEX_FILE} of hub repository {repo_id!r} is unreadable: {error}"
        ) from None


def _transport_errors(hub) -> tuple[type[BaseException], ...]:
    """The exceptions for an unreachable hub: the HTTP library's transport errors (the library
    ``huggingface_hub`` uses: httpx in 1.x, httpx2 in 2.x) and offline mode."""
    library = importlib.import_module(type(hub.get_session()).__module__.partition(".")[0])
    return (library.TransportError, hub.errors.OfflineModeIsEnabled)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
