"""A small Hugging Face Hub on loopback: the API subset ``huggingface_hub.snapshot_download`` uses.

Serves model repos from local directories: ``GET /api/models/{repo}/revision/{rev}`` (model info:
the commit sha), ``GET /api/models/{repo}/tree/{commit}`` (the file listing) and
``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with ``X-Repo-Commit`` and ``ETag`` headers (LFS
files with ``X-Linked-Etag`` / ``X-Linked-Size``, as the Hub sends them). Every request is logged
in ``requests`` so a test can check which files were fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    lfs: frozenset[str] = frozenset()  # paths stored as LFS objects (weights)
    commit: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name])
        self.commit = digest.hexdigest()

    def oid(self, path: str) -> str:
        data = self.files[path]
        if path in self.lfs:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str]] = []  # (method, path)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

            def do_GET(self) -> None:
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-hub",
                                        daemon=True)

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    def fetched(self) -> list[str]:
        """Files whose content was downloaded (GET on resolve)."""
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p in self.requests
                if m == "GET" and "/resolve/" in p]

    def _find(self, path: str) -> tuple[str, Repo, str] | None:
        for name, repo in self.repos.items():
            if path.startswith(name + "/"):
                return name, repo, path[len(name) + 1:]
        return None

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path))
        if path.startswith("/api/models/"):
            found = self._find(path[len("/api/models/"):])
            if found is None:
                return self._error(h, 404, "RepoNotFound", body)
            name, repo, rest = found
            if rest.startswith("revision/"):
                if rest.split("/", 1)[1] not in ("main", repo.commit):
                    return self._error(h, 404, "RevisionNotFound", body)
                info = {"id": name, "modelId": name, "sha": repo.commit, "private": False,
                        "siblings": [{"rfilename": f} for f in sorted(repo.files)]}
                return self._json(h, info, body)
            if rest.startswith("tree/"):
                tree = []
                for f, data in sorted(repo.files.items()):
                    entry: dict[str, object] = {"type": "file", "path": f, "size": len(data),
                                                "oid": hashlib.sha1(data).hexdigest()}
                    if f in repo.lfs:
                        entry["lfs"] = {"oid": repo.oid(f), "size": len(data), "pointerSize": 134}
                    tree.append(entry)
                return self._json(h, tree, body)
            return self._error(h, 404, "EntryNotFound", body)
        found = self._find(path.lstrip("/"))
        if found is None or not found[2].startswith("resolve/"):
            return self._error(h, 404, "RepoNotFound", body)
        _, repo, rest = found
        rev, _, file = rest[len("resolve/"):].partition("/")
        if rev not in ("main", repo.commit):
            return self._error(h, 404, "RevisionNotFound", body)
        if file not in repo.files:
            return self._error(h, 404, "EntryNotFound", body)
        data = repo.files[file]
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{repo.oid(file)}"')
        if file in repo.lfs:
            h.send_header("X-Linked-Etag", f'"{repo.oid(file)}"')
            h.send_header("X-Linked-Size", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _json(self, h: BaseHTTPRequestHandler, obj: object, body: bool) -> None:
        data = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, body: bool) -> None:
        data = json.dumps({"error": code}).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", code)
        h.end_headers()
        if body:
            h.wfile.write(data)


def repo_from_dir(model_dir: Path, extra: dict[str, bytes] | None = None,
                  lfs: frozenset[str] = frozenset()) -> Repo:
    files = {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}
    return Repo({**files, **(extra or {})}, lfs)


@contextmanager
def fake_hub(repos: dict[str, Repo]) -> Iterator[FakeHub]:
    hub = FakeHub(repos).start()
    try:
        yield hub
    finally:
        hub.stop()
