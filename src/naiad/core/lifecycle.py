"""Model lifecycle: load, atomic reload, unload, poll; it publishes what serves to the Router.

Reloads are atomic: new versions load beside the serving ones, the routing table switches in
one step, and only then do replaced versions drain and unload. A failed load leaves whatever
was serving untouched.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import Host
from naiad.config.options import ServerOptions
from naiad.core.cache import ResponseCache
from naiad.core.ensemble import ENSEMBLE_PLATFORM, check_steps
from naiad.core.labels import VersionLabels, same_but_labels, without_labels
from naiad.core.loader import prepare_config, start_version
from naiad.core.model import LoadedVersion, VersionServices
from naiad.core.router import Router
from naiad.errors import InvalidArgument, NaiadError, NotFound, Unavailable
from naiad.observability.statistics import LatencySettings
from naiad.repository.catalog import Repositories
from naiad.repository.local import Discovery, Fingerprint, ModelSource, fingerprint, select_versions, version_dirs
from naiad.repository.remote import RepositoryUnavailable
from naiad.scheduling.rate_limiter import RateLimiter
from naiad.scheduling.timers import Timers

log = logging.getLogger(__name__)

DUPLICATE_REASON = "model appears in two or more repositories"
EVICTED_REASON = "evicted"  # unloaded to keep within --model-memory-budget (core.residency)
RELOAD_DRAIN_SECS = 30.0


@dataclass(slots=True)
class VersionStatus:
    state: str
    reason: str = ""


@dataclass(slots=True)
class ModelRecord:
    """What the manager knows of one model name, serving or not."""

    name: str
    serving: dict[int, LoadedVersion] = field(default_factory=dict)
    status: dict[int, VersionStatus] = field(default_factory=dict)
    error: str = ""
    attempted: Any = None  # fingerprint of the last load attempt: poll retries only after a change
    override: mc.ModelConfig | None = None  # a load's config override is remembered
    files_dir: Path | None = None  # temporary model directory from `file:` overrides
    repository: Any = None  # where the model was last loaded from (a Path or a RemoteLocation)
    relabelled: VersionLabels | None = None  # labels changed at run time: they outlive plain reloads


class ModelManager:
    """The model lifecycle: load / reload / unload, ensemble dependencies, polling and the index.

    Over 25 methods for a reason: Triton's repository API is that many operations on one state
    machine (records behind per-model locks); routing is the Router's, loading a version the
    loader's, so what remains here is the state machine itself.
    """

    def __init__(self, options: ServerOptions, host: Host | None = None) -> None:
        self.options = options
        self.host = host  # what backends call back into (the server)
        self.services = VersionServices(
            Timers(),
            RateLimiter(options.rate_limit_resources) if options.rate_limit == "execution_count" else None,
            # One cache for every model (Triton's local cache is shared too); models opt in.
            ResponseCache(options.response_cache_bytes) if options.response_cache_bytes else None,
            # Process-wide in Triton: one setting for every model's latency metrics.
            LatencySettings.from_config(options.metrics_config),
        )
        self.repositories = Repositories(options.model_repositories)
        self._records: dict[str, ModelRecord] = {}
        self.router = Router()  # what serves: the lifecycle publishes to it, requests read it
        self._model_locks: dict[str, threading.Lock] = {}
        self.on_demand = options.model_load_on_demand  # models load when asked for, not when found
        self.on_unloaded: Callable[[str], None] | None = None  # told of unloads other than evictions
        self._locks_lock = threading.Lock()

    # -- what serves (the Router holds it; these are conveniences for the server) -----------

    def get(self, name: str, version: int | None) -> LoadedVersion:
        """The serving version, for metadata and config (no slot taken)."""
        return self.router.get(name, version)

    def serving_versions(self, name: str) -> list[int]:
        return self.router.versions(name)

    def loaded(self) -> list[LoadedVersion]:
        return self.router.loaded()

    def known_names(self) -> set[str]:
        """The models the repository has or had (loaded or not)."""
        return {entry["name"] for entry in self.index()}

    # -- load / unload -----------------------------------------------------------------------

    def load(self, name: str, override: mc.ModelConfig | None = None,
             files: dict[str, bytes] | None = None, found: Discovery | None = None) -> None:
        """Load or reload `name`; a no-op when nothing changed. Raises with Triton's texts on failure.
        `found`: a scan just made (startup, poll), so that a bucket is not listed again per model."""
        _check_name(name)
        if files and override is None:
            raise InvalidArgument("failed to load '" + name + "', config must be provided with file override")
        with self._model_lock(name):
            record = self._records.setdefault(name, ModelRecord(name))
            if override is not None:
                record.override = override
                record.relabelled = None  # a new config brings its own labels
            previous_files = record.files_dir
            model_dir, stamp = self._model_dir(record, files, found)
            try:
                self._load_locked(record, model_dir, stamp)
            except BaseException:
                if files:  # nothing loads from the new directory: drop it; the previous one may still serve
                    shutil.rmtree(model_dir, ignore_errors=True)
                    record.files_dir = previous_files
                raise
            finally:
                self._prune(record)
            if files and previous_files is not None and all(
                    loaded.model_dir != previous_files for loaded in record.serving.values()):
                shutil.rmtree(previous_files, ignore_errors=True)  # the versions it served are replaced

    def _model_dir(self, record: ModelRecord, files: dict[str, bytes] | None,
                   found: Discovery | None = None) -> tuple[Path, Fingerprint | None]:
        """The directory to load from and, for a repository model, its fingerprint before download."""
        if files:  # a new directory; the previous one goes once this load has succeeded
            record.files_dir = _write_model_files(record.name, files)
            return record.files_dir, None
        if record.files_dir is not None:
            return record.files_dir, None
        found = found if found is not None else self.repositories.discover()
        if record.name in found.duplicates:
            record.error = DUPLICATE_REASON
            raise Unavailable(f"failed to load '{record.name}', {DUPLICATE_REASON}")
        source = found.models.get(record.name)
        if source is None:
            # The model may be in a repository that cannot be listed now: say which and why.
            why = "".join(f"; {reason}" for reason in found.unavailable.values())
            raise InvalidArgument(f"failed to load '{record.name}', failed to poll from model repository{why}")
        return self._materialize(record, source)

    def _materialize(self, record: ModelRecord, source: ModelSource) -> tuple[Path, Fingerprint]:
        stamp = self.repositories.stamp(source)
        try:
            path = self.repositories.materialize(source)
        except RepositoryUnavailable as error:
            self._fail(record, {}, str(error))
            raise Unavailable(f"failed to load '{record.name}', {error}") from None
        record.repository = source.repository
        return path, stamp

    def _prune(self, record: ModelRecord) -> None:
        """Remove a remote model's cache snapshots that no serving version loads from."""
        if record.repository is not None:
            keep = {loaded.model_dir for loaded in record.serving.values()}
            self.repositories.prune(record.name, record.repository, keep)

    def _load_locked(self, record: ModelRecord, model_dir: Path, stamp: Fingerprint | None = None) -> None:
        name = record.name
        record.attempted = stamp if stamp is not None else fingerprint(model_dir)
        try:
            config, cls = prepare_config(name, model_dir, self.options, record.override)
            labels = record.relabelled or VersionLabels.from_config(name, config)
        except Exception as error:  # a backend's auto-complete may fail with any error
            reason = str(error) or type(error).__name__
            self._fail(record, {}, reason)
            raise InvalidArgument(f"load failed for model '{name}': {reason}") from None
        if config.platform == ENSEMBLE_PLATFORM:
            self._load_composing(record, config)
        available = version_dirs(model_dir)
        wanted = select_versions(config.version_policy, list(available))
        if not wanted:
            self._fail(record, {}, "at least one version must be available under the version policy of the model")
            raise InvalidArgument(f"load failed for model '{name}': {record.error}")
        started, failures = self._start_versions(record, config, cls, model_dir, wanted, available)
        if not failures and started == record.serving:
            self.router.relabel(name, _in_force(labels))  # a config that changed only its labels lands here
            return  # nothing changed: every version kept serving as it was
        if failures:
            for loaded in started.values():
                if loaded not in record.serving.values():
                    loaded.stop(0)
            self._fail(record, failures, "")
            detail = "; ".join(f"version {v} is at UNAVAILABLE state: {r}" for v, r in sorted(failures.items()))
            raise InvalidArgument(f"load failed for model '{name}': {detail};")
        self._switch(record, started, labels)

    def _load_composing(self, record: ModelRecord, config: mc.ModelConfig) -> None:
        """An ensemble serves only with its composing models: load those not serving yet (in
        every control mode, as Triton does for explicit loads), then check that the steps fit them."""
        composing: dict[int, mc.ModelConfig] = {}
        for index, step in enumerate(config.ensemble_scheduling.step):
            name = step.model_name
            try:
                if name == record.name:
                    raise InvalidArgument("an ensemble cannot be one of its own steps")
                if not self.router.serves(name):
                    self.load(name)
                version = step.model_version if step.model_version > 0 else None
                composing[index] = self.get(name, version).config
            except NaiadError as error:
                self._fail(record, {}, f"composing model '{name}' is not available: {error}")
                raise InvalidArgument(f"load failed for model '{record.name}': {record.error}") from None
        try:
            check_steps(config, composing)
        except InvalidArgument as error:
            self._fail(record, {}, str(error))
            raise InvalidArgument(f"load failed for model '{record.name}': {error}") from None

    def _start_versions(self, record: ModelRecord, config: mc.ModelConfig, cls: Any, model_dir: Path,
                        wanted: list[int], available: dict[int, Path]
                        ) -> tuple[dict[int, LoadedVersion], dict[int, str]]:
        started: dict[int, LoadedVersion] = {}
        failures: dict[int, str] = {}
        for version in wanted:
            current = record.serving.get(version)
            version_dir = available.get(version)
            if version_dir is None:
                failures[version] = f"version {version} not found in model directory"
                continue
            stamp = fingerprint(version_dir)
            # Labels are routing, not serving: a config that changes only them reloads nothing.
            if current is not None and same_but_labels(current.config, config) and current.fingerprint == stamp:
                started[version] = current  # unchanged: keep serving it without a reload
                continue
            record.status.setdefault(version, VersionStatus("LOADING"))
            try:
                if current is not None and current.fingerprint == stamp and _only_instances_differ(current, config):
                    loaded = current.regrouped(config)  # same backend model, new instance groups
                else:
                    loaded = start_version(record.name, version, config, cls, model_dir, version_dir,
                                           self.services, self.host)
            except Exception as error:  # any failure of a backend is this version's load failure
                log.warning("failed to load '%s' version %d: %s", record.name, version, error)
                failures[version] = str(error) or type(error).__name__
                continue
            loaded.fingerprint = stamp
            started[version] = loaded
        return started, failures

    def _switch(self, record: ModelRecord, started: dict[int, LoadedVersion],
                labels: VersionLabels | None = None) -> None:
        replaced = [v for n, v in record.serving.items() if started.get(n) is not v]
        for old in replaced:
            if old.version in started:
                old.hand_model_to(started[old.version])
        self.router.publish(record.name, started, _in_force(labels))
        record.serving = started
        record.error = ""
        record.status = {n: VersionStatus("READY") for n in started}
        for old in replaced:
            if old.version not in started:
                record.status[old.version] = VersionStatus("UNAVAILABLE", "unloaded")
        log.info("successfully loaded '%s' version(s) %s", record.name, sorted(started))
        for old in replaced:
            old.stop(RELOAD_DRAIN_SECS)

    def _fail(self, record: ModelRecord, failures: dict[int, str], reason: str) -> None:
        record.error = reason
        for version, why in failures.items():
            if version not in record.serving:
                record.status[version] = VersionStatus("UNAVAILABLE", why)

    def unload(self, name: str, timeout: float = RELOAD_DRAIN_SECS, dependents: bool = False) -> None:
        """Stop routing to `name`, drain it, release it. Unloading an unknown model succeeds.
        With `dependents` (unload_dependents), an ensemble's composing models go too, unless
        another serving ensemble still uses them."""
        _check_name(name)
        composing = self._composing(name) if dependents else []
        self._unload(name, timeout)
        still_used = {step for other in self.loaded() for step in self._composing(other.name)}
        for step in composing:
            if step not in still_used:
                self._unload(step, timeout)

    def _composing(self, name: str) -> list[str]:
        """The models an ensemble's steps call (empty for other models and unknown names)."""
        try:
            config = self.router.get(name, None).config
        except NotFound:
            return []
        if config.platform != ENSEMBLE_PLATFORM:
            return []
        return sorted({step.model_name for step in config.ensemble_scheduling.step})

    def evict(self, name: str) -> None:
        """Unload `name` to make room (core.residency): the index then says "evicted"."""
        self._unload(name, RELOAD_DRAIN_SECS, reason=EVICTED_REASON)

    def serving(self, name: str) -> list[LoadedVersion]:
        """Every version of `name` that serves (none when it does not)."""
        record = self._records.get(name)
        return list(record.serving.values()) if record is not None else []

    def serving_names(self) -> list[str]:
        return [name for name, record in list(self._records.items()) if record.serving]

    def in_repository(self, name: str) -> bool:
        return name in self.discover().models

    def source_path(self, name: str) -> Path | None:
        """Where the repository keeps `name` locally (a remote model's cache), if it has it."""
        source = self.discover().models.get(name)
        return source.path if source is not None and source.path.exists() else None

    def _unload(self, name: str, timeout: float, prune: bool = True, reason: str = "unloaded") -> None:
        """`prune`: also drop a remote model's cache (kept at shutdown, so a restart reuses it)."""
        with self._model_lock(name):
            record = self._records.get(name)
            if record is None:
                return
            self.router.withdraw(name)
            record.relabelled = None
            for version in record.serving:
                record.status[version] = VersionStatus("UNLOADING")
            for version, loaded in list(record.serving.items()):
                loaded.stop(timeout)
                record.status[version] = VersionStatus("UNAVAILABLE", reason)
            record.serving = {}
            if record.files_dir is not None:
                shutil.rmtree(record.files_dir, ignore_errors=True)
                record.files_dir = None
            if prune:
                self._prune(record)
            log.info("successfully unloaded '%s'%s", name, " (evicted)" if reason == EVICTED_REASON else "")
        if reason != EVICTED_REASON and self.on_unloaded is not None:
            self.on_unloaded(name)

    def relabel(self, name: str, labels: str | None, split: str | None) -> VersionLabels:
        """Change a serving model's labels and/or split (None keeps one as it is, "" removes it)
        without reloading any version; they stay in force until a load brings a new config."""
        _check_name(name)
        with self._model_lock(name):
            record = self._records.get(name)
            if record is None or not record.serving:
                raise InvalidArgument(f"failed to change the version labels of '{name}': the model is not loaded")
            current = self.router.labels(name) or VersionLabels(name)
            updated = current.changed(labels, split)
            record.relabelled = updated
            self.router.relabel(name, _in_force(updated))
        log.info("version labels of '%s': %s (split: %s)", name, updated.labels_text() or "none",
                 updated.split_text() or "none")
        return updated

    def _model_lock(self, name: str) -> threading.Lock:
        with self._locks_lock:
            return self._model_locks.setdefault(name, threading.Lock())

    # -- startup, polling, shutdown ----------------------------------------------------------

    def load_many(self, names: list[str]) -> dict[str, str]:
        """Load models concurrently (--model-load-thread-count); returns name → error for failures."""
        errors: dict[str, str] = {}
        found = self.discover()

        def one(name: str) -> None:
            try:
                self.load(name, found=found)
            except NaiadError as error:
                errors[name] = str(error)

        with ThreadPoolExecutor(max(self.options.model_load_thread_count, 1)) as pool:
            list(pool.map(one, names))
        return errors

    def discover(self) -> Discovery:
        return self.repositories.discover()

    def poll(self) -> None:
        """Load what is new or changed since its last attempt; unload what left the repository."""
        found = self.discover()
        for name, source in found.models.items():
            record = self._records.get(name)
            if record is not None and record.files_dir is not None:
                continue
            if self.on_demand and (record is None or not record.serving):
                continue  # loaded when a request asks for it (core.residency), not by the poll
            if record is None or record.attempted != self.repositories.stamp(source):
                try:
                    self.load(name, found=found)
                except NaiadError as error:
                    log.error("%s", error)
        for name in list(self._records):
            record = self._records[name]
            if _repository_down(record, found):
                continue  # a bucket that cannot be listed now has not lost its models: keep serving
            if name not in found.models and record.files_dir is None and record.serving:
                self.unload(name)
            if name not in found.models and record.files_dir is None:
                self._records.pop(name, None)

    def stop_all(self, timeout: float) -> None:
        """Unload everything; `timeout` bounds the whole shutdown, not each model."""
        deadline = time.monotonic() + timeout
        for name in list(self._records):
            self._unload(name, max(deadline - time.monotonic(), 0.0), prune=False)
        self.services.timers.close()

    # -- index and readiness -----------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        found = self.discover()
        names = sorted(set(found.models) | set(found.duplicates) | set(self._records))
        entries: list[dict[str, Any]] = []
        for name in names:
            entries.extend(self._index_entries(name, found))
        if ready_only:
            entries = [e for e in entries if e.get("state") == "READY"]
        return entries

    def _index_entries(self, name: str, found: Discovery) -> list[dict[str, Any]]:
        if name in found.duplicates:
            return [{"name": name, "state": "UNAVAILABLE", "reason": DUPLICATE_REASON}]
        record = self._records.get(name)
        if record is None or (not record.status and not record.error):
            return [{"name": name}]
        if not record.status:
            return [{"name": name, "state": "UNAVAILABLE", "reason": record.error}]
        return [self._version_entry(name, record, v, s) for v, s in sorted(record.status.items())]

    @staticmethod
    def _version_entry(name: str, record: ModelRecord, version: int, status: VersionStatus) -> dict[str, Any]:
        """A loaded version whose instances cannot serve now (an LLM engine restarting after its
        core died) is listed UNAVAILABLE with their reason, as the ready endpoint answers."""
        loaded = record.serving.get(version)
        if status.state == "READY" and loaded is not None and (reason := loaded.not_ready_reason()):
            return _index_entry(name, str(version), "UNAVAILABLE", reason)
        return _index_entry(name, str(version), status.state, status.reason)

    def all_ready(self) -> bool:
        """Strict readiness: every model the server tried to load serves."""
        return all(
            not record.error and all(s.state == "READY" or s.reason in ("unloaded", EVICTED_REASON)
                                     for s in record.status.values())
            for record in self._records.values()
        )


def _repository_down(record: ModelRecord, found: Discovery) -> bool:
    spec = getattr(record.repository, "spec", None)
    return spec is not None and spec in found.unavailable


def _index_entry(name: str, version: str, state: str, reason: str) -> dict[str, Any]:
    """Like Triton, an entry carries `reason` only when there is one."""
    entry = {"name": name, "version": version, "state": state}
    if reason:
        entry["reason"] = reason
    return entry


def _only_instances_differ(current: LoadedVersion, config: mc.ModelConfig) -> bool:
    """A config change that touches instance_group alone is applied without reloading the model."""
    before, after = without_labels(current.config), without_labels(config)  # copies
    before.ClearField("instance_group")
    after.ClearField("instance_group")
    return bool(before == after)


def _in_force(labels: VersionLabels | None) -> VersionLabels | None:
    """The labels to route by: None when there are none (the hot path then skips them)."""
    return labels if labels is not None and (labels.labels or labels.split) else None


def _check_name(name: str) -> None:
    if not name:
        raise InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    if "/" in name or "\\" in name or name in (".", "..") or ".." in name.split("/"):
        raise InvalidArgument("model name must not contain path traversal characters")


def _write_model_files(name: str, files: dict[str, bytes]) -> Path:
    """`file:<version>/<path>` overrides become a temporary model directory."""
    root = Path(tempfile.mkdtemp(prefix=f"naiad-{name}-"))
    for relative, content in files.items():
        target = (root / relative).resolve()
        if not target.is_relative_to(root.resolve()):
            shutil.rmtree(root, ignore_errors=True)
            raise InvalidArgument("file override path must not contain path traversal characters")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return root
