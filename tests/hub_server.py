"""A local HTTP server speaking the part of the Hub API that huggingface_hub uses to push and to download.

Uploads (tests/callbacks/test_hub.py): whoami-v2, repos/create, branch, preupload (every file "regular",
so inlined), validate-yaml, commit. Downloads (tests/run/test_hub_resume.py, what ``snapshot_download``
calls): the revision's info, its recursive tree, and ``resolve`` (HEAD and GET) of each file. A
revision's files are its commits laid over each other, as on the Hub; a commit's oid resolves to the
files as of that commit. No code of huggingface_hub is patched out.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "hf_test_token_0123456789"
REPO = "tester/boring"


class FakeHub(ThreadingHTTPServer):
    """The Hub's state: repos, branches and commits (``{"repo", "revision", "oid", "message", "files"}``)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.commit_delay = 0.0
        self.commit_status = 200
        self.repos: dict[str, dict] = {}
        self.branches: list[str] = []
        self.commits: list[dict] = []
        self.whoami_calls = 0
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def files(self, repo: str, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """The head oid and files of `revision` (a branch or a commit oid) of `repo`; None if it has none."""
        on_branch = [c for c in self.commits if c["repo"] == repo and c["revision"] == revision]
        at_commit = next((c for c in self.commits if c["repo"] == repo and c["oid"] == revision), None)
        if at_commit is not None:
            on_branch = [c for c in self.commits if c["repo"] == repo and c["revision"] == at_commit["revision"]]
            on_branch = on_branch[: on_branch.index(at_commit) + 1]
        if not on_branch and not (revision == "main" and repo in self.repos):
            return None
        files: dict[str, bytes] = {}
        for commit in on_branch:
            files.update(commit["files"])
        return (on_branch[-1]["oid"] if on_branch else "0" * 40), files


@contextlib.contextmanager
def running_hub(monkeypatch) -> Iterator[FakeHub]:
    """Serve a `FakeHub` on a free port, with ``HF_TOKEN`` set to its token, for the length of the block."""
    server = FakeHub()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )  # quick shutdown
    thread.start()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # git's blob id, as the Hub's


class _Handler(BaseHTTPRequestHandler):
    server: FakeHub

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _reply(self, code: int, payload, headers: dict[str, str] | None = None, body: bytes | None = None) -> None:
        body = json.dumps(payload).encode() if body is None else body
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if payload is not None else "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.headers.get("authorization") == f"Bearer {TOKEN}":
            return True
        self._reply(401, {"error": "Invalid credentials in Authorization header"})
        return False

    def _not_found(self, code: str, message: str) -> None:
        # huggingface_hub tells a missing repo, revision and file apart by this header
        self._reply(404, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = urllib.parse.unquote(self.path.split("?")[0])
        if path == "/api/whoami-v2":
            if self._authorized():
                self.server.whoami_calls += 1
                self._reply(200, {"type": "user", "name": "tester", "orgs": []})
            return
        found = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?", path) or re.fullmatch(
            r"/([^/]+/[^/]+)/(resolve)/([^/]+)/(.+)", path
        )
        if found is None:
            return self._reply(404, {"error": f"no route {self.path}"})
        repo, action, revision, rest = found.groups()
        if repo not in self.server.repos:
            return self._not_found("RepoNotFound", f"Repository not found: {repo}")
        state = self.server.files(repo, revision)
        if state is None:
            return self._not_found("RevisionNotFound", f"Invalid rev id: {revision}")
        oid, files = state
        if action == "revision":
            siblings = [{"rfilename": name} for name in sorted(files)]
            return self._reply(200, {"id": repo, "modelId": repo, "sha": oid, "private": False, "siblings": siblings})
        if action == "tree":
            entries = [
                {"type": "file", "oid": _blob_oid(content), "size": len(content), "path": name}
                for name, content in sorted(files.items())
            ]
            return self._reply(200, entries)
        if rest not in files:
            return self._not_found("EntryNotFound", f"{rest} does not exist on {revision}")
        content = files[rest]
        headers = {"X-Repo-Commit": oid, "ETag": f'"{_blob_oid(content)}"'}
        self._reply(200, None, headers, body=content)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if not self._authorized():
            return
        hub, path = self.server, self.path.split("?")[0]
        if path == "/api/repos/create":
            data = json.loads(body)
            repo = f"{data['organization']}/{data['name']}"
            if repo in hub.repos:
                return self._reply(409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo}"})
            hub.repos[repo] = data
            return self._reply(200, {"url": f"{hub.url}/{repo}"})
        if path == "/api/validate-yaml":
            return self._reply(200, {"errors": [], "warnings": []})
        match = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit|branch)/(.+)", path)
        if match is None or match.group(1) not in hub.repos:
            return self._reply(404, {"error": f"Repository not found: {path}"})
        repo, action, revision = match.groups()
        if action == "branch":
            hub.branches.append(revision)
            return self._reply(200, {})
        if action == "preupload":
            files = json.loads(body)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]
            return self._reply(200, {"files": modes})
        time.sleep(hub.commit_delay)  # a slow Hub
        if hub.commit_status != 200:
            return self._reply(hub.commit_status, {"error": "You don't have the rights to push to this repo"})
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        files = {
            item["value"]["path"]: base64.b64decode(item["value"]["content"]) for item in lines if item["key"] == "file"
        }
        oid = f"{len(hub.commits) + 1:040x}"
        commit = {"repo": repo, "revision": revision, "oid": oid, "message": header["summary"], "files": files}
        hub.commits.append(commit)
        self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None})
