"""Which loaded version serves a request: the hot path's view of the model table.

The lifecycle (core.lifecycle.ModelManager) publishes one immutable `Serving` snapshot per model
whenever what serves changes (a load, a reload's switch, a relabel, an unload); the `Router` is
the only owner of the table. Requests read the snapshot without a lock: `acquire` takes an
in-flight slot on the chosen version, then checks that the snapshot it chose from is still the
one in force, and retries otherwise. So a version the lifecycle has switched away from (and is
draining) never gains a request, and a request never waits on the lifecycle.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from naiad.core.labels import VersionLabels
from naiad.core.model import LoadedVersion
from naiad.errors import InvalidArgument, NotFound, Unavailable


@dataclass(frozen=True, slots=True)
class Serving:
    """One model's serving versions, the one a request without a version gets (the version
    policy's latest), and its version labels (None when it has none)."""

    versions: Mapping[int, LoadedVersion]
    default: LoadedVersion
    labels: VersionLabels | None = None


class Router:
    def __init__(self) -> None:
        self._models: dict[str, Serving] = {}
        self._lock = threading.Lock()  # serializes publishers; readers never take it

    # -- what the lifecycle publishes ------------------------------------------------------------

    def publish(self, name: str, versions: Mapping[int, LoadedVersion], labels: VersionLabels | None) -> None:
        """`versions` serve `name` from now on (the highest is the default)."""
        with self._lock:
            self._models[name] = Serving(dict(versions), versions[max(versions)], labels)

    def relabel(self, name: str, labels: VersionLabels | None) -> None:
        with self._lock:
            current = self._models.get(name)
            if current is not None:
                self._models[name] = Serving(current.versions, current.default, labels)

    def withdraw(self, name: str) -> None:
        with self._lock:
            self._models.pop(name, None)

    # -- the hot path ------------------------------------------------------------------------------

    def acquire(self, name: str, version: int | None, label: str | None = None,
                request_id: str = "") -> tuple[LoadedVersion, str | None]:
        """The version a request goes to, with an in-flight slot taken (release it when done),
        and the label that routed it, if any: the label it named, or the one the model's
        weighted split chose for it."""
        while True:
            serving = self._serving(name)
            if label is None and (version is not None or serving.labels is None):
                loaded, chosen = _versioned(name, serving, version), None
            else:
                chosen = label
                if chosen is None and serving.labels is not None:
                    chosen = serving.labels.choose(request_id)
                loaded = (_labelled(name, chosen, version, serving) if chosen is not None
                          else _versioned(name, serving, version))
            loaded.acquire()
            if self._models.get(name) is serving:
                return loaded, chosen
            loaded.release()  # switched meanwhile: the replaced version is draining

    def get(self, name: str, version: int | None) -> LoadedVersion:
        """The serving version, for metadata and config (no slot taken)."""
        return _versioned(name, self._serving(name), version)

    def label_version(self, name: str, label: str, loaded_only: bool = False) -> int:
        """The version `label` names for `name`; `loaded_only`: fail when it does not serve."""
        serving = self._serving(name)
        if not loaded_only:
            return _label_table(name, label, serving.labels).resolve(label)
        return _labelled(name, label, None, serving).version

    def labels(self, name: str) -> VersionLabels | None:
        """The labels in force for a serving model (None when it has none)."""
        return self._serving(name).labels

    def serves(self, name: str) -> bool:
        return name in self._models

    def versions(self, name: str) -> list[int]:
        serving = self._models.get(name)
        return sorted(serving.versions) if serving is not None else []

    def loaded(self) -> list[LoadedVersion]:
        return [v for serving in list(self._models.values()) for v in serving.versions.values()]

    def _serving(self, name: str) -> Serving:
        serving = self._models.get(name)
        if serving is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return serving


def _versioned(name: str, serving: Serving, version: int | None) -> LoadedVersion:
    if version is None:
        return serving.default
    loaded = serving.versions.get(version)
    if loaded is None:
        raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
    return loaded


def _label_table(name: str, label: str, labels: VersionLabels | None) -> VersionLabels:
    if labels is None:
        raise InvalidArgument(f"label '{label}' is not defined for model '{name}'")
    return labels


def _labelled(name: str, label: str, version: int | None, serving: Serving) -> LoadedVersion:
    """The serving version `label` names."""
    if not isinstance(label, str):
        raise InvalidArgument("the 'version_label' request parameter must be a string")
    target = _label_table(name, label, serving.labels).resolve(label)
    if version is not None and version != target:
        raise InvalidArgument(f"model '{name}': version {version} was requested but label '{label}' "
                              f"names version {target}")
    loaded = serving.versions.get(target)
    if loaded is None:
        raise Unavailable(f"version {target} of model '{name}' (label '{label}') is not ready")
    return loaded
