"""Artifact bytes in an S3-compatible object store (boto3).

Keys keep the tree's shape under the configured prefix, so a person with read access to the
bucket recognises what is there::

    <prefix>/<tenant>/<project>/<task>/0003-turn/artifacts/<name>/<upload id>

Each upload gets a key of its own (the last segment, a ULID) and is written create-only
(``If-None-Match: *``): an object, once written, never changes, so a reader holding a row
always gets the bytes that row describes, and a replacement can never tear a download in
flight. Bytes are written before the row that names them; a key no row names (a failed or
replaced upload) is an orphan, which the sweeper removes once it is older than the grace
period (:meth:`BlobStore.orphans`).

Uploads stream: a body larger than one part goes up as a multipart upload of ``PART_BYTES``
parts, so a worker holds one part at a time whatever the artifact's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from app.storage.core.errors import LockTimeout, PayloadTooLarge, StorageError

log = logging.getLogger("app.storage.pg")

PART_BYTES = 5 << 20  # S3's smallest part: the memory a worker holds per upload
_DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys


class BlobError(StorageError):
    """The object store refused or failed a request."""


class BlobExists(BlobError):
    """A create-only write found the key taken."""


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


@dataclass(frozen=True, slots=True)
class BlobUrl:
    bucket: str
    prefix: str

    @staticmethod
    def parse(url: str) -> BlobUrl:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"{url!r} is not s3://bucket[/prefix]")
        prefix = parts.path.strip("/")
        return BlobUrl(parts.netloc, prefix + "/" if prefix else "")


@dataclass(frozen=True, slots=True)
class Written:
    key: str
    size: int
    sha256: str


class BlobReader:
    """A stored object as a seekable binary file: a seek re-opens the body at that offset
    (HTTP Range), so a ranged download fetches only the bytes it sends."""

    def __init__(self, store: BlobStore, key: str, size: int, body: Any) -> None:
        self._store = store
        self._key = key
        self._size = size
        self._body = body
        self._pos = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        target += offset
        if target != self._pos:
            self._body.close()
            self._body = self._store.body(self._key, start=target) if target < self._size else None
            self._pos = target
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if self._body is None or self._pos >= self._size:
            return b""
        try:
            data: bytes = self._body.read() if size is None or size < 0 else self._body.read(size)
        except (BotoCoreError, OSError) as exc:
            raise BlobError(f"reading {self._key}: {exc}") from None
        self._pos += len(data)
        return data

    def fileno(self) -> int:
        raise OSError("an object store body has no file descriptor")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._body is not None:
                self._body.close()

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# This process's boto3 session, shared by every BlobStore it opens. A session loads S3's
# service model once, a tenth of a second of CPU; a client made from a loaded session costs a
# few milliseconds (the tests open hundreds of stores). A session is not thread-safe: it is
# only used under _SESSION_LOCK. A forked child starts with neither the session nor the lock.
_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


def _forget_session() -> None:
    global _SESSION, _SESSION_LOCK
    _SESSION = None
    _SESSION_LOCK = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_session)


def _session() -> Any:
    """This process's session (the caller holds _SESSION_LOCK)."""
    global _SESSION
    if _SESSION is None:
        # Imported here: a tenth of a second that a process which never touches an object
        # (an admin command, a worker before its first artifact) need not pay.
        import boto3

        _SESSION = boto3.session.Session()
    return _SESSION


class BlobStore:
    """One bucket (and key prefix) of an S3-compatible store."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, timeout: float = 30.0):
        self.url = BlobUrl.parse(url)
        self.bucket = self.url.bucket
        self.endpoint_url = endpoint_url
        self.timeout = timeout
        self._clients: dict[int, Any] = {}

    # -- the client ------------------------------------------------------------------------
    def client(self) -> Any:
        """This process's client (boto3 clients are thread-safe, but must not cross a fork)."""
        pid = os.getpid()
        found = self._clients.get(pid)
        if found is None:
            with _SESSION_LOCK:
                found = self._clients.get(pid)
                if found is None:
                    from botocore.config import Config

                    found = _session().client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        config=Config(
                            s3={"addressing_style": "path"},
                            connect_timeout=self.timeout,
                            read_timeout=self.timeout,
                            retries={"max_attempts": 3, "mode": "standard"},
                            max_pool_connections=32,
                            request_checksum_calculation="when_required",
                            response_checksum_validation="when_required",
                        ),
                    )
                    self._clients = {pid: found}
        return found

    def key(self, *parts: str) -> str:
        return self.url.prefix + "/".join(parts)

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except ClientError as exc:
            if _status(exc) in (500, 502, 503, 504) or _code(exc) == "SlowDown":
                raise LockTimeout(f"object store busy ({what}): {_code(exc)}") from None
            raise BlobError(f"object store refused {what}: {_code(exc)} {exc}") from None
        except BotoCoreError as exc:
            raise _unavailable(what, exc) from None

    # -- writes ----------------------------------------------------------------------------
    def put_new(self, key: str, stream: IO[bytes], *, limit: int, content_type: str) -> Written:
        """Stream ``stream`` to a new object at ``key`` (create-only); PayloadTooLarge past
        ``limit`` bytes, with nothing left behind."""
        digest = hashlib.sha256()
        size = 0
        # One buffer, reused part after part: the only copy of the body this process holds.
        buf = bytearray(PART_BYTES)

        def next_part() -> bytearray:
            nonlocal size, buf
            filled = 0
            while filled < PART_BYTES:
                chunk = stream.read(min(PART_BYTES - filled, 1 << 20))
                if not chunk:
                    break
                buf[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"artifact of more than {limit} bytes exceeds the limit", limit=limit
                    )
                del chunk
            if filled < PART_BYTES:
                del buf[filled:]  # the last part: the buffer is not needed again
            digest.update(buf)
            return buf

        client = self.client()
        part = next_part()
        if len(part) < PART_BYTES:
            self._put_once(key, part, content_type)
            return Written(key, size, digest.hexdigest())
        upload = self._call(
            "create multipart upload",
            client.create_multipart_upload,
            Bucket=self.bucket,
            Key=key,
            ContentType=content_type,
        )
        upload_id = upload["UploadId"]
        parts: list[dict[str, Any]] = []
        try:
            while part:
                number = len(parts) + 1
                done = self._call(
                    "upload part",
                    client.upload_part,
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=part,
                )
                parts.append({"PartNumber": number, "ETag": done["ETag"]})
                if len(part) < PART_BYTES:
                    break
                part = next_part()
            self._complete(key, upload_id, parts)
        except BaseException:
            with contextlib.suppress(ClientError, BotoCoreError):  # else the sweeper aborts it
                client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise
        return Written(key, size, digest.hexdigest())

    def _put_once(self, key: str, data: bytes | bytearray, content_type: str) -> None:
        try:
            self.client().put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType=content_type, IfNoneMatch="*"
            )
        except ClientError as exc:
            if _status(exc) in (409, 412):
                raise BlobExists(f"{key} exists") from None
            raise
        except BotoCoreError as exc:
            raise _unavailable("put", exc) from None

    def _complete(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        try:
            self.client().complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                IfNoneMatch="*",
            )
        except ClientError as exc:
            if _status(exc) in (409, 412):
                raise BlobExists(f"{key} exists") from None
            raise BlobError(f"object store refused completing {key}: {_code(exc)}") from None
        except BotoCoreError as exc:
            raise _unavailable("complete upload", exc) from None

    def delete(self, keys: Iterable[str]) -> None:
        """Delete ``keys`` (absent ones are no error)."""
        batch = list(keys)
        for i in range(0, len(batch), _DELETE_BATCH):
            chunk = batch[i : i + _DELETE_BATCH]
            self._call(
                "delete",
                self.client().delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
            )

    # -- reads -----------------------------------------------------------------------------
    def body(self, key: str, *, start: int = 0) -> Any:
        """The streaming body of ``key`` from byte ``start``; FileNotFoundError if absent."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if start:
            kwargs["Range"] = f"bytes={start}-"
        try:
            return self.client().get_object(**kwargs)["Body"]
        except ClientError as exc:
            if _code(exc) in ("NoSuchKey", "404") or _status(exc) == 404:
                raise FileNotFoundError(key) from None
            raise BlobError(f"object store refused reading {key}: {_code(exc)}") from None
        except BotoCoreError as exc:
            raise _unavailable("get", exc) from None

    def open(self, key: str, size: int) -> BlobReader:
        return BlobReader(self, key, size, self.body(key))

    def read_bytes(self, key: str) -> bytes | None:
        try:
            body = self.body(key)
        except FileNotFoundError:
            return None
        with body:
            data: bytes = body.read()
        return data

    def size(self, key: str) -> int | None:
        try:
            head = self.client().head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise BlobError(f"object store refused HEAD {key}: {_code(exc)}") from None
        except BotoCoreError as exc:
            raise _unavailable("head", exc) from None
        return int(head["ContentLength"])

    def listing(self, prefix: str = "") -> Iterator[tuple[str, datetime, int]]:
        """(key, last modified, size) of every object under the store's prefix + ``prefix``."""
        paginator = self.client().get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.url.prefix + prefix):
                for obj in page.get("Contents", []):
                    yield str(obj["Key"]), obj["LastModified"], int(obj["Size"])
        except ClientError as exc:
            raise BlobError(f"object store refused listing: {_code(exc)}") from None
        except BotoCoreError as exc:
            raise _unavailable("list", exc) from None

    def stale_uploads(self, older_than: datetime) -> list[tuple[str, str]]:
        """(key, upload id) of multipart uploads begun before ``older_than`` and never ended."""
        try:
            found = self.client().list_multipart_uploads(Bucket=self.bucket, Prefix=self.url.prefix)
        except ClientError:
            return []  # not every store lists them; abandoned parts then wait for its own expiry
        except BotoCoreError as exc:
            raise _unavailable("list uploads", exc) from None
        return [
            (str(u["Key"]), str(u["UploadId"]))
            for u in found.get("Uploads", [])
            if u["Initiated"] < older_than
        ]

    def abort_upload(self, key: str, upload_id: str) -> None:
        self._call(
            "abort upload",
            self.client().abort_multipart_upload,
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
        )

    def ready(self) -> None:
        self._call("head bucket", self.client().head_bucket, Bucket=self.bucket)

    def check_bucket(self) -> None:
        """Refuse a bucket the object store says is not one (BlobError, at start-up: else
        every artifact write would answer 500). A store that cannot be reached now is left
        to each request (a 503 until it comes back)."""
        try:
            self.client().head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code, status = _code(exc), _status(exc)
            if code == "InvalidBucketName" or (status == 400 and code in ("", "400")):
                why = "is not a valid bucket name"
            elif code in ("NoSuchBucket", "404") or status == 404:
                why = "does not exist"
            else:
                return  # refused for another reason (permissions): each request reports it
            raise BlobError(
                f"MEMORY_BLOB_URL bucket {self.bucket!r} {why} ({code or status})"
            ) from None
        except ParamValidationError as exc:
            raise BlobError(
                f"MEMORY_BLOB_URL bucket {self.bucket!r} is not a valid bucket name ({exc})"
            ) from None
        except BotoCoreError:
            return


def _unavailable(what: str, exc: BotoCoreError) -> LockTimeout:
    # botocore's text names the endpoint and the object's key: it stays in the log.
    log.warning("object store unavailable (%s): %s", what, exc)
    return LockTimeout(f"object store unavailable ({what})")
