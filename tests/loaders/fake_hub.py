"""A loopback server speaking as much of the model hub's HTTP API as ``huggingface_hub``'s
downloads use, so that loading by hub id runs its real download path with no internet:

- ``GET /api/models/{repo}[/revision/{rev}]``: the model info (``sha``, ``siblings``);
- ``GET /api/models/{repo}/tree/{rev}``: the file listing (git blob ids, LFS sizes and sha256);
- ``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}``: a small file, or for an LFS file (weights) a
  redirect to ``/cdn/{sha256}`` on a second port (another origin, as the hub's CDN is another
  host) with ``X-Linked-Etag`` / ``X-Linked-Size``; ``X-Repo-Commit`` and ``ETag`` on every
  answer; ``Range`` requests answered;
- errors as the hub sends them (``X-Error-Code``): ``RepoNotFound`` (401, also for a private
  repository without its token), ``GatedRepo`` (401 without a token, 403 with another),
  ``RevisionNotFound`` and ``EntryNotFound`` (404).

It advertises no Xet storage (no ``xetHash``, no ``X-Xet-*`` header), so ``hf_xet`` is never
used. Every request is recorded (``requests``) for the tests to check what was fetched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.server
import json
import re
import socket
import threading
import urllib.parse

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pth", ".onnx")


@dataclasses.dataclass
class FakeRepo:
    """One model repository: commits (sha -> files) and branches or tags (name -> sha)."""

    commits: dict[str, dict[str, bytes]] = dataclasses.field(default_factory=dict)
    refs: dict[str, str] = dataclasses.field(default_factory=dict)
    gated: bool = False
    private: bool = False
    token: str | None = None  # the token that may read it (gated or private)


class FakeHub:
    """The server (``start`` / ``stop``) and its repositories (``add``)."""

    def __init__(self):
        self.repos: dict[str, FakeRepo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 -> content, what /cdn/ serves
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self._servers: list[http.server.ThreadingHTTPServer] = []  # the API's, the CDN's
        self._connections: set[socket.socket] = set()  # open (kept-alive) connections

    def add(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        ref: str = "main",
        gated: bool = False,
        private: bool = False,
        token: str | None = None,
    ) -> str:
        """Adds a commit holding ``files`` to ``repo_id`` (created if new) as branch ``ref``;
        returns the commit's sha."""
        repo = self.repos.setdefault(repo_id, FakeRepo())
        repo.gated, repo.private, repo.token = gated, private, token
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + files[path])
        sha = digest.hexdigest()
        repo.commits[sha] = dict(files)
        repo.refs[ref] = sha
        for data in files.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = data
        return sha

    @property
    def url(self) -> str:
        """The endpoint (``HF_ENDPOINT``)."""
        return _address(self._servers[0])

    def start(self) -> FakeHub:
        handler = type("Handler", (_Handler,), {"hub": self})
        for _ in range(2):
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)
        return self

    def stop(self) -> None:
        """Stops listening: connections are refused from here on (the ports are closed)."""
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for connection in list(self._connections):  # a client's kept-alive connection too
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def downloaded(self) -> list[str]:
        """The repository paths asked for (``HEAD`` or ``GET`` of ``resolve``: every file
        ``huggingface_hub`` fetches; LFS content then comes from the CDN address)."""
        return sorted(
            {
                path.split("/resolve/", 1)[1].split("/", 1)[1]
                for _, path in self.requests
                if "/resolve/" in path
            }
        )


def _address(server) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.hub._connections.add(self.connection)

    def finish(self):
        self.hub._connections.discard(self.connection)
        super().finish()

    def log_message(self, *args):  # quiet: the tests read ``hub.requests``
        pass

    def do_HEAD(self):
        self._route(body=False)

    def do_GET(self):
        self._route(body=True)

    # -- routing ------------------------------------------------------------------------------
    def _route(self, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        self.hub.requests.append((self.command, path))
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path):
            return self._info(match[1], match[2] or "main", body)
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
            return self._tree(match[1], match[2], match[3] or "", body)
        if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(match[1], match[2], match[3], body)
        if match := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
            data = self.hub.blobs.get(match[1])
            if data is None:
                return self._error(404, None, "no such blob")
            return self._content(data, {"ETag": f'"{match[1]}"'}, body)
        return self._error(404, None, f"no route {path}")

    def _commit(self, repo_id: str, revision: str, *, files: bool) -> tuple[str, dict] | None:
        """The (sha, files) of ``revision``; answers the error and returns None where the
        repository or revision is missing or may not be read."""
        repo = self.hub.repos.get(repo_id)
        token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip() or None
        if repo is None or (repo.private and token != repo.token):
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        sha = repo.refs.get(revision, revision if revision in repo.commits else None)
        if sha is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return None
        if files and repo.gated and token != repo.token:
            status = 401 if token is None else 403
            self._error(status, "GatedRepo", f"Access to model {repo_id} is restricted.")
            return None
        return sha, repo.commits[sha]

    def _info(self, repo_id: str, revision: str, body: bool) -> None:
        found = self._commit(repo_id, revision, files=False)
        if found is None:
            return
        sha, files = found
        repo = self.hub.repos[repo_id]
        info = {
            "_id": sha[:24],
            "id": repo_id,
            "modelId": repo_id,
            "sha": sha,
            "private": repo.private,
            "gated": "auto" if repo.gated else False,
            "disabled": False,
            "siblings": [{"rfilename": path} for path in sorted(files)],
        }
        self._json(info, {"X-Repo-Commit": sha}, body)

    def _tree(self, repo_id: str, revision: str, folder: str, body: bool) -> None:
        found = self._commit(repo_id, revision, files=False)
        if found is None:
            return
        sha, files = found
        entries, folders = [], set()
        for path in sorted(files):
            if folder and not path.startswith(folder.rstrip("/") + "/"):
                continue
            parts = path.split("/")
            folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
            data = files[path]
            entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
            if path.endswith(LFS_SUFFIXES):
                lfs = {
                    "oid": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
                entry["lfs"] = lfs
            entries.append(entry)
        entries += [
            {"type": "directory", "oid": git_blob_id(f.encode()), "size": 0, "path": f}
            for f in sorted(folders)
        ]
        self._json(entries, {"X-Repo-Commit": sha}, body)

    def _resolve(self, repo_id: str, revision: str, path: str, body: bool) -> None:
        found = self._commit(repo_id, revision, files=True)
        if found is None:
            return
        sha, files = found
        if path not in files:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {revision}")
        data = files[path]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_id(data)}"'}
        if path.endswith(LFS_SUFFIXES):  # weights live in LFS: a redirect to the CDN
            sha256 = hashlib.sha256(data).hexdigest()
            headers.update(
                {
                    "X-Linked-Etag": f'"{sha256}"',
                    "X-Linked-Size": str(len(data)),
                    "Location": f"{_address(self.hub._servers[1])}/cdn/{sha256}",
                    "Content-Length": "0",
                }
            )
            self.send_response(302)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            return None
        return self._content(data, headers, body)

    # -- answers ------------------------------------------------------------------------------
    def _content(self, data: bytes, headers: dict, body: bool) -> None:
        start, status = 0, 200
        if match := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
            start, status = int(match[1]), 206
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        part = data[start:]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(part)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            self.wfile.write(part)

    def _json(self, value, headers: dict, body: bool) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        for key, header in headers.items():
            self.send_header(key, header)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str | None, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code is not None:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
