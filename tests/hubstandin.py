"""A local stand-in for the Hugging Face Hub endpoints ``eaglequant publish`` calls.

The only mock in the test suite: the Hub cannot exist here. It speaks the HTTP
that ``huggingface_hub`` sends for repo info, repo creation, README metadata
validation, preupload (upload modes), the LFS batch API with basic PUT transfer
and verify, the NDJSON commit and paths-info, and it checks what it receives: a
token, an LFS object whose bytes hash to its oid and have its size, an LFS commit
entry naming a stored object, well-formed front matter. Anything else is answered
with an error, so a wrong upload fails the test. It listens on 127.0.0.1 only,
in a daemon thread, and shuts itself down after ``lifetime_s``.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

# The .gitattributes the Hub puts in a new model repository (abridged to the model formats).
GITATTRIBUTES = (
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.pt filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.png filter=lfs diff=lfs merge=lfs -text\n"
)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def lfs_pointer(oid: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


@dataclass
class Entry:
    """One file in a commit's tree: its bytes (regular) or its LFS object."""

    data: bytes | None = None
    lfs_oid: str | None = None
    lfs_size: int | None = None

    def info(self, path: str) -> dict[str, Any]:
        if self.lfs_oid is None:
            assert self.data is not None
            return {
                "type": "file",
                "path": path,
                "size": len(self.data),
                "oid": git_blob_id(self.data),
            }
        pointer = lfs_pointer(self.lfs_oid, self.lfs_size or 0)
        return {
            "type": "file",
            "path": path,
            "size": self.lfs_size,
            "oid": git_blob_id(pointer),
            "lfs": {"oid": self.lfs_oid, "size": self.lfs_size, "pointerSize": len(pointer)},
        }


@dataclass
class Commit:
    oid: str
    summary: str
    description: str
    tree: dict[str, Entry]
    changed: list[str]


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, list[Commit]] = field(default_factory=dict)
    pulls: list[Commit] = field(default_factory=list)


class HubStandIn:
    """The server and what it holds: repos, their commits, the LFS objects, the requests."""

    def __init__(self, token: str, lfs_threshold: int = 10 * 1024 * 1024, lifetime_s: float = 120):
        self.token = token
        self.lfs_threshold = lfs_threshold
        self.lifetime_s = lifetime_s
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.lfs_sizes: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.problems: list[str] = []
        self.lock = threading.Lock()
        self._oids = (hashlib.sha1(str(i).encode()).hexdigest() for i in itertools.count())
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.server.shutdown)
        self._timer.daemon = True

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def commits(self, repo_id: str, branch: str = "main") -> list[Commit]:
        return self.repos[repo_id].branches[branch]

    # The endpoints, each returning (status, body, extra headers).

    def create_repo(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        repo_id = (
            f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        )
        if body.get("type") not in (None, "model"):
            return 400, {"error": f"stand-in serves model repos only, not {body.get('type')}"}, {}
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo"}, {}
        repo = Repo(repo_id, private=body.get("visibility") == "private")
        attributes = Entry(data=GITATTRIBUTES.encode())
        first = Commit(
            next(self._oids),
            "initial commit",
            "",
            {".gitattributes": attributes},
            [".gitattributes"],
        )
        repo.branches["main"] = [first]
        self.repos[repo_id] = repo
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id, "id": repo_id}, {}

    def repo_info(self, repo_id: str, revision: str) -> tuple[int, Any, dict[str, str]]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
        if revision not in repo.branches:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        head = repo.branches[revision][-1]
        siblings = [{"rfilename": p} for p in sorted(head.tree)]
        return (
            200,
            {"id": repo_id, "sha": head.oid, "private": repo.private, "siblings": siblings},
            {},
        )

    def validate_yaml(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        content = body.get("content", "")
        parts = content.split("---\n")
        if len(parts) < 3 or parts[0].strip():
            return 400, {"errors": [{"message": "README.md has no YAML front matter"}]}, {}
        try:
            meta = yaml.safe_load(parts[1])
        except yaml.YAMLError as exc:
            return 400, {"errors": [{"message": f"invalid YAML: {exc}"}]}, {}
        if not isinstance(meta, dict):
            return 400, {"errors": [{"message": "front matter is not a mapping"}]}, {}
        return 200, {"errors": [], "warnings": []}, {}

    def preupload(self, repo: Repo, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        head = repo.branches["main"][-1]
        patterns = [
            line.split()[0]
            for line in (head.tree[".gitattributes"].data or b"").decode().splitlines()
            if "filter=lfs" in line
        ]
        files = []
        for item in body["files"]:
            sample = base64.b64decode(item["sample"])
            lfs = (
                any(fnmatch.fnmatch(item["path"], p) for p in patterns)
                or item["size"] >= self.lfs_threshold
                or b"\0" in sample
            )
            files.append(
                {
                    "path": item["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                }
            )
        return 200, {"files": files, "commitOid": head.oid}, {}

    def lfs_batch(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        if body.get("operation") != "upload" or body.get("hash_algo") != "sha256":
            return 400, {"message": "stand-in takes sha256 uploads only"}, {}
        objects = []
        for item in body["objects"]:
            oid, size = item["oid"], item["size"]
            self.lfs_sizes[oid] = size
            entry: dict[str, Any] = {"oid": oid, "size": size}
            if oid not in self.lfs:
                entry["actions"] = {
                    "upload": {"href": f"{self.url}/lfs-upload/{oid}"},
                    "verify": {"href": f"{self.url}/lfs-verify/{oid}"},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}, {}

    def lfs_upload(self, oid: str, data: bytes) -> tuple[int, Any, dict[str, str]]:
        actual = hashlib.sha256(data).hexdigest()
        if actual != oid or len(data) != self.lfs_sizes.get(oid):
            self.problems.append(f"LFS PUT {oid}: got sha256 {actual}, {len(data)} bytes")
            return 400, {"message": "bytes do not match the oid or size"}, {}
        self.lfs[oid] = data
        return 200, {}, {}

    def lfs_verify(self, oid: str, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        if oid not in self.lfs or body.get("oid") != oid or body.get("size") != len(self.lfs[oid]):
            return 404, {"message": f"object {oid} not stored with that size"}, {}
        return 200, {}, {}

    def commit(
        self, repo: Repo, revision: str, lines: list[dict[str, Any]], create_pr: bool
    ) -> tuple[int, Any, dict[str, str]]:
        if revision not in repo.branches:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        if not lines or lines[0].get("key") != "header":
            return 400, {"error": "the NDJSON must start with a header line"}, {}
        header = lines[0]["value"]
        tree = dict(repo.branches[revision][-1].tree)
        changed = []
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                if value.get("encoding") != "base64":
                    return 400, {"error": "regular files must be base64"}, {}
                tree[value["path"]] = Entry(data=base64.b64decode(value["content"]))
            elif line["key"] == "lfsFile":
                oid = value["oid"]
                if (
                    value.get("algo") != "sha256"
                    or oid not in self.lfs
                    or value.get("size") != len(self.lfs[oid])
                ):
                    self.problems.append(f"commit names LFS object {oid} that was not uploaded")
                    return 422, {"error": f"LFS object {oid} of {value['path']} not uploaded"}, {}
                tree[value["path"]] = Entry(lfs_oid=oid, lfs_size=value["size"])
            else:
                return 400, {"error": f"stand-in does not take {line['key']}"}, {}
            changed.append(value["path"])
        if not changed:
            return 400, {"error": "empty commit"}, {}
        commit = Commit(
            next(self._oids), header["summary"], header.get("description", ""), tree, changed
        )
        url = f"{self.url}/{repo.repo_id}/commit/{commit.oid}"
        if create_pr:
            repo.pulls.append(commit)
            number = len(repo.pulls)
            return (
                200,
                {
                    "commitUrl": url,
                    "commitOid": commit.oid,
                    "pullRequestUrl": f"{self.url}/{repo.repo_id}/discussions/{number}",
                },
                {},
            )
        repo.branches[revision].append(commit)
        return 200, {"commitUrl": url, "commitOid": commit.oid, "pullRequestUrl": None}, {}

    def paths_info(
        self, repo: Repo, revision: str, paths: list[str]
    ) -> tuple[int, Any, dict[str, str]]:
        if revision not in repo.branches:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        tree = repo.branches[revision][-1].tree
        return 200, [tree[p].info(p) for p in paths if p in tree], {}


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", ""):
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    data += self.rfile.read(size) if size else b""
                    self.rfile.readline()
                    if not size:
                        return data
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            body = self._body()
            with hub.lock:
                hub.requests.append((method, parts.path))
                if self.headers.get(
                    "Authorization"
                ) != f"Bearer {hub.token}" and not parts.path.startswith("/lfs-"):
                    status, payload, headers = 401, {"error": "Invalid credentials"}, {}
                else:
                    try:
                        status, payload, headers = self._route(
                            method, parts.path, parse_qs(parts.query), body
                        )
                    except (KeyError, ValueError, TypeError) as exc:
                        hub.problems.append(f"{method} {parts.path}: malformed request ({exc!r})")
                        status, payload, headers = 400, {"error": f"malformed request: {exc!r}"}, {}
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _route(
            self, method: str, path: str, query: dict[str, list[str]], body: bytes
        ) -> tuple[int, Any, dict[str, str]]:
            segments = [unquote(s) for s in path.strip("/").split("/")]
            if method == "POST" and path == "/api/repos/create":
                return hub.create_repo(json.loads(body))
            if method == "POST" and path == "/api/validate-yaml":
                return hub.validate_yaml(json.loads(body))
            if method == "PUT" and segments[0] == "lfs-upload":
                return hub.lfs_upload(segments[1], body)
            if method == "POST" and segments[0] == "lfs-verify":
                return hub.lfs_verify(segments[1], json.loads(body))
            if (
                method == "POST"
                and len(segments) == 6
                and segments[1].endswith(".git")
                and segments[2:] == ["info", "lfs", "objects", "batch"]
            ):
                repo_id = f"{segments[0]}/{segments[1][: -len('.git')]}"
                if repo_id not in hub.repos:
                    return (
                        404,
                        {"message": "Repository not found"},
                        {"X-Error-Code": "RepoNotFound"},
                    )
                return hub.lfs_batch(json.loads(body))
            if segments[:2] == ["api", "models"] and len(segments) >= 4:
                repo_id = f"{segments[2]}/{segments[3]}"
                rest = segments[4:]
                if method == "GET" and not rest:
                    return hub.repo_info(repo_id, "main")
                if method == "GET" and len(rest) == 2 and rest[0] == "revision":
                    return hub.repo_info(repo_id, rest[1])
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
                if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                    return hub.preupload(repo, json.loads(body))
                if method == "POST" and len(rest) == 2 and rest[0] == "commit":
                    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                    create_pr = query.get("create_pr") == ["1"]
                    return hub.commit(repo, rest[1], lines, create_pr)
                if method == "POST" and len(rest) == 2 and rest[0] == "paths-info":
                    form = parse_qs(body.decode())
                    return hub.paths_info(repo, rest[1], form.get("paths", []))
            hub.problems.append(f"unexpected {method} {path}")
            return 404, {"error": f"stand-in has no {method} {path}"}, {}

    return Handler
