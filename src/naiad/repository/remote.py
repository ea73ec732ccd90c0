"""A model repository in object storage, materialised model by model into a local cache.

One listing of the bucket prefix tells which models exist and gives each a fingerprint (relative
key, size, ETag): change detection needs no download. Loading a model materialises its current
listing as a new snapshot directory named after that fingerprint: files unchanged since an
earlier snapshot are hard-linked from it, the rest are downloaded in parallel and checked (size,
and MD5 where the service states it), and the finished directory appears in one rename. A snapshot
never changes once made, so the version serving from it never sees a file change under it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from naiad.repository.credentials import CredentialError, credentials_for
from naiad.repository.location import RemoteLocation
from naiad.repository.stores import Blob, Store, StoreError, open_store

log = logging.getLogger(__name__)

Listing = tuple[Blob, ...]
DOWNLOAD_THREADS = 8
LARGE_MODEL_BYTES = 64 * 1024 * 1024  # above this, download progress is logged every 10%
_MOUNT_VARS = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
               "as": "TRITON_AZURE_MOUNT_DIRECTORY"}


class RepositoryUnavailable(Exception):
    """A remote repository that cannot be listed or read; the message names it and the reason."""

    def __init__(self, location: RemoteLocation, reason: str) -> None:
        super().__init__(f"model repository '{location.spec}' is not available: {reason}")
        self.location = location
        self.reason = reason


def cache_root(scheme: str, environ: Mapping[str, str] | None = None) -> Path:
    """TRITON_<AWS|GCS|AZURE>_MOUNT_DIRECTORY when set, else $NAIAD_CACHE_DIR or ~/.cache/naiad."""
    env = os.environ if environ is None else environ
    mount = env.get(_MOUNT_VARS[scheme])
    if mount:
        return Path(mount)
    base = env.get("NAIAD_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "naiad")
    return Path(base) / "repositories"


class RemoteRepository:
    def __init__(self, location: RemoteLocation, environ: Mapping[str, str] | None = None,
                 store_factory: Callable[[], Store] | None = None) -> None:
        self.location = location
        digest = hashlib.sha256(location.spec.encode()).hexdigest()[:12]
        self.root = cache_root(location.scheme, environ) / f"{location.scheme}-{location.bucket}-{digest}"
        self._environ = environ
        self._store_factory = store_factory
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self.large_model_bytes = LARGE_MODEL_BYTES

    def store(self) -> Store:
        """The SDK client, made on first use: credentials are read then (and again after a failure)."""
        with self._store_lock:
            if self._store is None:
                try:
                    if self._store_factory is not None:
                        self._store = self._store_factory()
                    else:
                        self._store = open_store(self.location, credentials_for(self.location, self._environ))
                except (StoreError, CredentialError) as error:
                    raise RepositoryUnavailable(self.location, str(error)) from None
            return self._store

    # -- listing -----------------------------------------------------------------------------

    def models(self) -> dict[str, Listing]:
        """Model name → its blobs, from one listing; RepositoryUnavailable when it cannot be listed."""
        try:
            blobs = self.store().list(self.location.prefix)
        except StoreError as error:
            with self._store_lock:
                self._store = None  # the next scan reads the credentials again: they may have been fixed
            raise RepositoryUnavailable(self.location, str(error)) from None
        found: dict[str, list[Blob]] = {}
        for blob in blobs:
            relative = blob.key[len(self.location.prefix):]
            name, slash, rest = relative.partition("/")
            # Files beside the models, hidden names and keys that climb out are not models' files.
            if not slash or not name or name.startswith(".") or not _safe(relative):
                continue
            found.setdefault(name, [])
            if rest:
                found[name].append(blob)
        return {name: tuple(sorted(items, key=lambda b: b.key)) for name, items in sorted(found.items())}

    def fingerprint(self, name: str, listing: Listing) -> tuple[tuple[str, int, str], ...]:
        """Relative key, size and ETag of every blob: equal fingerprints mean no change."""
        skip = len(self.location.prefix) + len(name) + 1
        return tuple((blob.key[skip:], blob.size, blob.etag) for blob in listing)

    def model_path(self, name: str) -> Path:
        """Where this model's snapshots live in the cache."""
        return self.root / name

    # -- materialising -----------------------------------------------------------------------

    def materialize(self, name: str, listing: Listing) -> Path:
        """The snapshot directory holding exactly `listing`, made now unless it already exists."""
        stamp = self.fingerprint(name, listing)
        digest = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]
        model_root = self.model_path(name)
        snapshot = model_root / digest
        manifest = model_root / f"{digest}.json"
        if manifest.is_file() and snapshot.is_dir():
            return snapshot  # unchanged since it was made (the manifest is written last)
        model_root.mkdir(parents=True, exist_ok=True)
        staging = model_root / f".partial-{digest}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self._fill(name, stamp, listing, staging)
            if snapshot.exists():
                shutil.rmtree(snapshot)  # an earlier attempt that stopped before its manifest
            os.rename(staging, snapshot)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        tmp = manifest.with_name(f".{manifest.name}.{os.getpid()}")
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, manifest)
        return snapshot

    def _fill(self, name: str, stamp: tuple[tuple[str, int, str], ...], listing: Listing, staging: Path) -> None:
        have = self._cached_files(name)
        staging.mkdir()
        todo: list[tuple[Blob, Path]] = []
        linked = 0
        for (relative, size, etag), blob in zip(stamp, listing, strict=True):
            target = staging / relative
            if relative.endswith("/"):  # a "directory marker" key
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = have.get((relative, size, etag))
            if source is not None and _link(source, target):
                linked += 1
            else:
                todo.append((blob, target))
        total = sum(blob.size for blob, _ in todo)
        log.info("model '%s' from '%s': downloading %d file(s), %.1f MB (%d unchanged file(s) reused)",
                 name, self.location.spec, len(todo), total / 1e6, linked)
        progress = _Progress(name, total, total >= self.large_model_bytes)
        store = self.store()
        with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
            futures = [pool.submit(self._download, store, blob, target, progress) for blob, target in todo]
            errors = [future.exception() for future in futures]
        failed = [error for error in errors if error is not None]
        if failed:
            if isinstance(failed[0], StoreError):
                raise RepositoryUnavailable(self.location, f"downloading model '{name}': {failed[0]}")
            raise failed[0]

    def _download(self, store: Store, blob: Blob, target: Path, progress: _Progress) -> None:
        store.download(blob, target)
        size = target.stat().st_size
        if size != blob.size:
            raise StoreError("download incomplete", f"'{blob.key}' has {size} bytes, the listing said {blob.size}")
        if blob.md5 is not None and _md5(target) != blob.md5:
            raise StoreError("download corrupt", f"'{blob.key}' does not match its MD5")
        progress.add(size)

    def _cached_files(self, name: str) -> dict[tuple[str, int, str], Path]:
        """Every file of this model's finished snapshots, by (relative key, size, ETag)."""
        have: dict[tuple[str, int, str], Path] = {}
        model_root = self.model_path(name)
        for manifest in sorted(model_root.glob("*.json")) if model_root.is_dir() else ():
            snapshot = model_root / manifest.stem
            try:
                entries = json.loads(manifest.read_text())
            except (OSError, ValueError):
                continue
            for relative, size, etag in entries:
                path = snapshot / relative
                if not relative.endswith("/") and path.is_file():
                    have.setdefault((relative, size, etag), path)
        return have

    def prune(self, name: str, keep: set[Path]) -> None:
        """Remove this model's snapshots except those in `keep` (the ones versions serve from)."""
        model_root = self.model_path(name)
        if not model_root.is_dir():
            return
        kept = {path.resolve() for path in keep}
        for manifest in model_root.glob("*.json"):
            snapshot = model_root / manifest.stem
            if snapshot.resolve() not in kept:
                manifest.unlink(missing_ok=True)  # first: a snapshot without a manifest is never reused
                shutil.rmtree(snapshot, ignore_errors=True)
        for staging in model_root.glob(".partial-*"):
            if not _alive(staging.name.split("-")[2]):
                shutil.rmtree(staging, ignore_errors=True)  # left by a process killed while downloading


class _Progress:
    """Logs every 10% of a large model's download (threads add to it as files complete)."""

    def __init__(self, name: str, total: int, enabled: bool) -> None:
        self.name, self.total, self.enabled = name, total, enabled
        self.done = 0
        self.next_step = 10
        self.lock = threading.Lock()

    def add(self, size: int) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.done += size
            percent = self.done * 100 // max(self.total, 1)
            if percent >= self.next_step:
                log.info("model '%s': downloaded %.1f of %.1f MB (%d%%)", self.name, self.done / 1e6,
                         self.total / 1e6, percent)
                self.next_step = (percent // 10 + 1) * 10


def _safe(relative: str) -> bool:
    return not any(part in (".", "..") for part in relative.split("/")) and not relative.startswith("/")


def _alive(pid: str) -> bool:
    """Whether the process that named a staging directory still runs (then it may still be filling it)."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _link(source: Path, target: Path) -> bool:
    try:
        os.link(source, target)
        return True
    except OSError:
        return False


def _md5(path: Path) -> bytes:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.digest()
