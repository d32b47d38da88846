"""The Hub emulator's large-file side: which files are LFS, the Git LFS batch API, the storage.

What huggingface_hub 2.4 meets on the Hub for every `*.safetensors` file, acted out:

- `wants_lfs`: preupload answers "lfs" for a path the repo's `.gitattributes` tracks with LFS
  (a new repo gets the Hub's default one, `*.safetensors` included), for 10 MiB or more, and
  for binary content (a NUL byte in the sample); commits refuse such content inline.
- `LfsApi`, on the API origin: `POST <repo>.git/info/lfs/objects/batch` answers, per object,
  nothing to do (already stored) or an upload action: a signed `PUT` URL on the storage origin
  ("basic"), or above `multipart_threshold` one signed URL per `chunk_size` part plus a signed
  completion URL on the API origin ("multipart"); and a `verify` action. Verify and completion
  check what the storage holds. `xet-write-token` is answered 404: this Hub has no Xet storage,
  so a client that takes the Xet path fails loudly here instead of passing unseen.
- `Storage`, the second origin (S3 in the Hub's case): signed URLs only, a request carrying
  `Authorization` is refused (400, as S3 does), an expired or forged signature is 403; a PUT
  is checked against the size and sha256 it was signed for; GETs serve stored objects with
  `Range` support. Its answers are S3-style XML errors. It has its own fault plan.

Objects are kept per repo (`EmuRepo.lfs_objects`, sha256 hex -> bytes), under the state's lock.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
from urllib.parse import parse_qs, urlencode, urlsplit

from hub_emulator_faults import FaultyServer, Reject, Request, json_response, ranged_response

LFS_SIZE = 10 * 1024 * 1024  # the Hub's rule: files of 10 MiB or more go to LFS
URL_TTL_S = 3600.0  # how long a signed URL works
LFS_JSON = "application/vnd.git-lfs+json"
# The Hub's default .gitattributes for a new model repo
HUB_GITATTRIBUTES = (
    "".join(
        f"{p} filter=lfs diff=lfs merge=lfs -text\n"
        for p in (
            *"*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel".split(),
            *"*.model *.msgpack *.npy *.npz *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt".split(),
            *"*.pth *.rar *.safetensors saved_model/**/* *.tar.* *.tar *.tflite *.tgz".split(),
            *"*.wasm *.xz *.zip *.zst *tfevents*".split(),
        )
    )
).encode()


def lfs_patterns(gitattributes: bytes | None) -> list[str]:
    """The patterns a .gitattributes file sends to LFS (`filter=lfs`)."""
    lines = (gitattributes or b"").decode(errors="replace").splitlines()
    return [ln.split()[0] for ln in lines if ln.strip() and "filter=lfs" in ln.split()[1:]]


def tracked(path: str, patterns: list[str]) -> bool:
    """Git's rule, enough for the Hub's patterns: without '/', a pattern matches the name."""
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(path if "/" in p else name, p) for p in patterns)


def wants_lfs(path: str, data_or_sample: bytes, size: int, gitattributes: bytes | None) -> bool:
    """Whether the Hub stores this file with LFS (preupload's "lfs"); empty files never."""
    if size == 0:
        return False
    binary = b"\0" in data_or_sample[:512]
    return size >= LFS_SIZE or binary or tracked(path, lfs_patterns(gitattributes))


def pointer(oid: str, size: int) -> bytes:
    """The Git LFS pointer file that stands for an object in the repo's git history."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


def s3_error(status: int, code: str, message: str) -> Reject:
    """An error as S3 names it (the storage origin words it in XML, the API origin in JSON)."""
    return Reject(status, message, code)


def xml_answer(err: Reject) -> tuple[int, dict[str, str], bytes]:
    code = err.code or "InternalError"
    body = (
        f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{err.message}</Message></Error>"
    )
    return err.status, {"Content-Type": "application/xml"}, body.encode()


class Signer:
    """Signed URLs: an HMAC of the method, path and expiry under a secret of this emulator."""

    def __init__(self, clock):
        self.clock, self._secret = clock, secrets.token_bytes(16)

    def sign(self, base: str, method: str, path: str, **params) -> str:
        params["expires"] = str(int(self.clock() + URL_TTL_S))
        params["signature"] = self._mac(method, path, params)
        return f"{base}{path}?{urlencode(params)}"

    def check(self, req: Request, method: str) -> dict[str, str]:
        """The signed parameters of `req`, or a Reject as S3 answers it."""
        if req.headers.get("Authorization"):
            raise s3_error(400, "InvalidArgument", "Only one auth mechanism allowed")
        params = {k: v[0] for k, v in req.query.items()}
        given = params.pop("signature", "")
        if not hmac.compare_digest(given, self._mac(method, req.raw_path, params)):
            raise s3_error(403, "SignatureDoesNotMatch", "The request signature does not match")
        if float(params.get("expires", "0")) < self.clock():
            raise s3_error(403, "AccessDenied", "Request has expired")
        return params

    def _mac(self, method: str, path: str, params: dict) -> str:
        text = "\n".join([method, path, *(f"{k}={params[k]}" for k in sorted(params))])
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()


class LfsApi:
    """The API origin's LFS endpoints, over the emulator's `HubState`."""

    def __init__(self, state):
        self.state = state
        self.signer = Signer(state.clock)
        self.storage_url = ""  # set once the storage origin listens
        self.multipart_threshold = 64 * 1024 * 1024  # the Hub decides; tests lower it
        self.chunk_size = 16 * 1024 * 1024

    def routes(self) -> list:
        repo = r"(?P<repo>[^/]+/[^/]+?)"
        return [
            ("POST", rf"/{repo}\.git/info/lfs/objects/batch", self.batch),
            ("POST", rf"/{repo}\.git/info/lfs/objects/verify", self.verify),
            ("POST", r"/api/complete_multipart", self.complete),
            ("GET", rf"/api/models/{repo}/xet-write-token/(?P<rev>[^/]+)", self.no_xet),
            ("GET", rf"/api/models/{repo}/xet-read-token/(?P<rev>[^/]+)", self.no_xet),
        ]

    def no_xet(self, req: Request, repo: str, rev: str):
        raise Reject(404, "This Hub emulator has no Xet storage: uploads take the LFS path")

    def batch(self, req: Request, repo: str):
        emu_repo, body = self.state.write_repo(req, repo), req.json()
        if body.get("operation") != "upload" or body.get("hash_algo", "sha256") != "sha256":
            raise Reject(400, "The emulator's batch API takes sha256 uploads only")
        objects = [
            self._object(repo, emu_repo, o, body.get("transfers") or ["basic"])
            for o in body.get("objects", [])
        ]
        multipart = any(
            "chunk_size" in (o.get("actions", {}).get("upload", {}).get("header") or {})
            for o in objects
        )
        answer = {"transfer": "multipart" if multipart else "basic", "objects": objects}
        status, headers, payload = json_response(answer)
        return status, {**headers, "Content-Type": LFS_JSON}, payload

    def _object(self, repo: str, emu_repo, obj: dict, transfers: list[str]) -> dict:
        oid, size = str(obj.get("oid", "")), obj.get("size")
        if not re.fullmatch(r"[0-9a-f]{64}", oid) or not isinstance(size, int) or size < 0:
            return {"oid": oid, "size": size or 0, "error": {"code": 422, "message": "bad object"}}
        out = {"oid": oid, "size": size, "authenticated": True}
        if emu_repo.lfs_objects.get(oid) is not None:
            return out  # already stored: no actions, the client skips the upload
        path = f"/lfs/{repo}/{oid}"
        if size >= self.multipart_threshold and "multipart" in transfers:
            upload = self._multipart(repo, path, oid, size)
        else:
            upload = {"href": self.signer.sign(self.storage_url, "PUT", path, size=str(size))}
        verify = {"href": f"{self.state.url}/{repo}.git/info/lfs/objects/verify"}
        out["actions"] = {"upload": upload, "verify": verify}
        return out

    def _multipart(self, repo: str, path: str, oid: str, size: int) -> dict:
        upload_id, parts = secrets.token_hex(8), -(-size // self.chunk_size)
        header = {"chunk_size": str(self.chunk_size)}
        for n in range(1, parts + 1):
            header[str(n)] = self.signer.sign(
                self.storage_url, "PUT", f"{path}/part/{n}", upload_id=upload_id
            )
        done = self.signer.sign(
            self.state.url,
            "POST",
            "/api/complete_multipart",
            repo=repo,
            oid=oid,
            size=str(size),
            upload_id=upload_id,
        )
        return {"href": done, "header": header}

    def complete(self, req: Request):
        params = self.signer.check(req, "POST")
        emu_repo = self.state.repos.get(params.get("repo", ""))
        if emu_repo is None:
            raise Reject(404, "Repository not found", "RepoNotFound")
        parts = emu_repo.parts.get(params["upload_id"], {})
        listed = req.json().get("parts", [])
        if [p.get("partNumber") for p in listed] != list(range(1, len(parts) + 1)) or any(
            p.get("etag") != etag_of(parts.get(p["partNumber"], b"")) for p in listed
        ):
            raise Reject(400, "Multipart completion: parts or etags do not match the uploads")
        data = b"".join(parts[n] for n in sorted(parts))
        check_object(data, params["oid"], int(params["size"]))
        emu_repo.lfs_objects[params["oid"]] = data
        del emu_repo.parts[params["upload_id"]]
        return json_response({})

    def verify(self, req: Request, repo: str):
        emu_repo, body = self.state.write_repo(req, repo), req.json()
        data = emu_repo.lfs_objects.get(str(body.get("oid")))
        if data is None or len(data) != body.get("size"):
            raise Reject(404, f"Object {body.get('oid')} not found (or not of that size)")
        return json_response({})

    def download_url(self, repo: str, oid: str) -> str:
        return self.signer.sign(self.storage_url, "GET", f"/lfs/{repo}/{oid}")


def etag_of(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def check_object(data: bytes, oid: str, size: int) -> None:
    if len(data) != size:
        raise s3_error(400, "IncompleteBody", f"Got {len(data)} bytes, signed for {size}")
    if hashlib.sha256(data).hexdigest() != oid:
        raise s3_error(400, "BadDigest", "The sha256 of the body does not match the object")


class Storage(FaultyServer):
    """The second origin: signed PUTs and GETs of LFS objects, on its own port and faults."""

    def __init__(self, state, lfs: LfsApi):
        self.state, self.lfs = state, lfs
        super().__init__(self.handle_storage)
        lfs.storage_url = self.url

    def handle_storage(self, req: Request):
        match = re.fullmatch(
            r"/lfs/(?P<repo>(?:datasets/)?[^/]+/[^/]+)/(?P<oid>[0-9a-f]{64})(?:/part/(?P<n>\d+))?",
            req.path,
        )
        method = "GET" if req.method == "HEAD" else req.method
        try:
            if match is None or method not in ("GET", "PUT"):
                raise s3_error(404, "NoSuchKey", "The specified key does not exist.")
            params = self.lfs.signer.check(req, method)
            with self.state.lock:
                emu_repo = self.state.repos.get(match["repo"])
                if emu_repo is None:
                    raise s3_error(404, "NoSuchBucket", "The specified bucket does not exist")
                if method == "GET":
                    return self._get(req, emu_repo, match["oid"])
                if match["n"] is not None:
                    emu_repo.parts.setdefault(params["upload_id"], {})[int(match["n"])] = req.body
                    return 200, {"ETag": etag_of(req.body)}, b""
                check_object(req.body, match["oid"], int(params["size"]))
                emu_repo.lfs_objects[match["oid"]] = req.body
                return 200, {"ETag": etag_of(req.body)}, b""
        except Reject as err:
            return xml_answer(err)

    def _get(self, req: Request, emu_repo, oid: str):
        data = emu_repo.lfs_objects.get(oid)
        if data is None:
            raise s3_error(404, "NoSuchKey", "The specified key does not exist.")
        headers = {"Content-Type": "application/octet-stream", "ETag": etag_of(data)}
        headers["Accept-Ranges"] = "bytes"
        return ranged_response(req, headers, data)


def signed_query(url: str) -> dict[str, str]:
    """The query of a signed URL (tests read what a batch answer signed)."""
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
