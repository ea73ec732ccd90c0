"""Model lifecycle: load, atomic reload, unload, poll, and the routing table requests use.

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
from naiad.core.model import LoadedVersion
from naiad.errors import InvalidArgument, NaiadError, NotFound, Unavailable
from naiad.repository.catalog import Repositories
from naiad.repository.local import Discovery, Fingerprint, ModelSource, fingerprint, select_versions, version_dirs
from naiad.repository.remote import RepositoryUnavailable
from naiad.scheduling.rate_limiter import RateLimiter

log = logging.getLogger(__name__)

DUPLICATE_REASON = "model appears in two or more repositories"
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
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.rate_limiter = (
            RateLimiter(options.rate_limit_resources) if options.rate_limit == "execution_count" else None
        )
        self.host: Host | None = None  # what backends call back into (set by the server)
        # One cache for every model (Triton's local cache is shared too); models opt in.
        self.response_cache = ResponseCache(options.response_cache_bytes) if options.response_cache_bytes else None
        self.repositories = Repositories(options.model_repositories)
        self._records: dict[str, ModelRecord] = {}
        self._routes: dict[str, tuple[dict[int, LoadedVersion], LoadedVersion]] = {}
        self._route_lock = threading.Lock()
        # Only models with labels have an entry: the hot path of the others is one dict miss.
        self._labels: dict[str, VersionLabels] = {}
        self._model_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    # -- routing (hot path) ------------------------------------------------------------------

    def acquire(self, name: str, version: int | None) -> LoadedVersion:
        """The version a request goes to, with an in-flight slot taken; release it when done."""
        with self._route_lock:
            loaded = self._route(name, version)
            loaded.acquire()
        return loaded

    def acquire_routed(self, name: str, version: int | None, label: str | None,
                       request_id: str) -> tuple[LoadedVersion, str | None]:
        """`acquire` for a request that may name a label, or fall under the model's weighted
        split: the version is resolved once, here, from the label table in force (a promotion
        swaps the table; requests resolved before it finish where they started). Returns the
        label that routed the request, if any."""
        if label is None and name not in self._labels:
            return self.acquire(name, version), None
        with self._route_lock:
            # One snapshot for both the split's choice and the resolution: a relabel between the
            # two could otherwise drop the chosen label.
            labels = self._labels.get(name)
            if label is None:
                if version is None and labels is not None:
                    label = labels.choose(request_id)
                if label is None:
                    loaded = self._route(name, version)
                    loaded.acquire()
                    return loaded, None
            loaded = self._labelled(name, label, version, labels)
            loaded.acquire()
        return loaded, label

    def label_version(self, name: str, label: str, loaded_only: bool = False) -> int:
        """The version `label` names for `name`; `loaded_only`: fail when it does not serve."""
        with self._route_lock:
            if not loaded_only:
                return self._label_table(name, label, self._labels.get(name)).resolve(label)
            return self._labelled(name, label, None, self._labels.get(name)).version

    def labels(self, name: str) -> VersionLabels | None:
        """The labels in force for a serving model (None when it has none)."""
        if name not in self._routes:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return self._labels.get(name)

    def _label_table(self, name: str, label: str, labels: VersionLabels | None) -> VersionLabels:
        if labels is None:
            if name not in self._routes:
                raise NotFound(f"Request for unknown model: '{name}' is not found")
            raise InvalidArgument(f"label '{label}' is not defined for model '{name}'")
        return labels

    def _labelled(self, name: str, label: str, version: int | None, labels: VersionLabels | None) -> LoadedVersion:
        """The serving version `label` names in `labels` (taken under the route lock)."""
        if not isinstance(label, str):
            raise InvalidArgument("the 'version_label' request parameter must be a string")
        target = self._label_table(name, label, labels).resolve(label)
        if version is not None and version != target:
            raise InvalidArgument(f"model '{name}': version {version} was requested but label '{label}' "
                                  f"names version {target}")
        route = self._routes.get(name)
        loaded = route[0].get(target) if route is not None else None
        if loaded is None:
            raise Unavailable(f"version {target} of model '{name}' (label '{label}') is not ready")
        return loaded

    def get(self, name: str, version: int | None) -> LoadedVersion:
        """The serving version, for metadata and config (no slot taken)."""
        with self._route_lock:
            return self._route(name, version)

    def _route(self, name: str, version: int | None) -> LoadedVersion:
        route = self._routes.get(name)
        if route is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        versions, default = route
        if version is None:
            return default
        loaded = versions.get(version)
        if loaded is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return loaded

    def known_names(self) -> set[str]:
        """The models the repository has or had (loaded or not)."""
        return {entry["name"] for entry in self.index()}

    def serving_versions(self, name: str) -> list[int]:
        route = self._routes.get(name)
        return sorted(route[0]) if route else []

    def loaded(self) -> list[LoadedVersion]:
        return [v for versions, _ in list(self._routes.values()) for v in versions.values()]

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
            model_dir, stamp = self._model_dir(record, files, found)
            try:
                self._load_locked(record, model_dir, stamp)
            finally:
                self._prune(record)

    def _model_dir(self, record: ModelRecord, files: dict[str, bytes] | None,
                   found: Discovery | None = None) -> tuple[Path, Fingerprint | None]:
        """The directory to load from and, for a repository model, its fingerprint before download."""
        if files:
            if record.files_dir is not None:
                shutil.rmtree(record.files_dir, ignore_errors=True)
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
            self._publish_labels(name, labels)  # a config that changed only its labels lands here
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
                if name not in self._routes:
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
                                           self.rate_limiter, self.host, self.response_cache)
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
        with self._route_lock:
            self._routes[record.name] = (dict(started), started[max(started)])
            self._set_labels(record.name, labels)
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
        route = self._routes.get(name)
        if route is None or route[1].config.platform != ENSEMBLE_PLATFORM:
            return []
        return sorted({step.model_name for step in route[1].config.ensemble_scheduling.step})

    def _unload(self, name: str, timeout: float, prune: bool = True) -> None:
        """`prune`: also drop a remote model's cache (kept at shutdown, so a restart reuses it)."""
        with self._model_lock(name):
            record = self._records.get(name)
            if record is None:
                return
            with self._route_lock:
                self._routes.pop(name, None)
                self._labels.pop(name, None)
            record.relabelled = None
            for version in record.serving:
                record.status[version] = VersionStatus("UNLOADING")
            for version, loaded in list(record.serving.items()):
                loaded.stop(timeout)
                record.status[version] = VersionStatus("UNAVAILABLE", "unloaded")
            record.serving = {}
            if record.files_dir is not None:
                shutil.rmtree(record.files_dir, ignore_errors=True)
                record.files_dir = None
            if prune:
                self._prune(record)
            log.info("successfully unloaded '%s'", name)

    def relabel(self, name: str, labels: str | None, split: str | None) -> VersionLabels:
        """Change a serving model's labels and/or split (None keeps one as it is, "" removes it)
        without reloading any version; they stay in force until a load brings a new config."""
        _check_name(name)
        with self._model_lock(name):
            record = self._records.get(name)
            if record is None or not record.serving:
                raise InvalidArgument(f"failed to change the version labels of '{name}': the model is not loaded")
            current = self._labels.get(name) or VersionLabels(name)
            updated = current.changed(labels, split)
            record.relabelled = updated
            self._publish_labels(name, updated)
        log.info("version labels of '%s': %s (split: %s)", name, updated.labels_text() or "none",
                 updated.split_text() or "none")
        return updated

    def _publish_labels(self, name: str, labels: VersionLabels | None) -> None:
        with self._route_lock:
            self._set_labels(name, labels)

    def _set_labels(self, name: str, labels: VersionLabels | None) -> None:
        """One reference swap (under the route lock): the atomic promotion."""
        if labels is None or not (labels.labels or labels.split):
            self._labels.pop(name, None)
        else:
            self._labels[name] = labels

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
            not record.error and all(s.state == "READY" or s.reason == "unloaded" for s in record.status.values())
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
    return before == after


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
