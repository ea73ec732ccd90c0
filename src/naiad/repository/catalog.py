"""All the server's model repositories, local and remote together: one discovery over them all.

A remote repository that cannot be listed contributes no models; its reason is kept in
`Discovery.unavailable` so that loads of the models it would hold say why, while the other
repositories go on serving.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from naiad.repository.local import Discovery, Fingerprint, ModelSource, discover, fingerprint
from naiad.repository.location import RemoteLocation, parse_repository
from naiad.repository.remote import RemoteRepository, RepositoryUnavailable

log = logging.getLogger(__name__)


class Repositories:
    def __init__(self, specs: Sequence[str | Path], environ: Mapping[str, str] | None = None) -> None:
        """`specs` as given on the command line; LocationError for a malformed remote one."""
        self.entries: list[Path | RemoteRepository] = []
        for spec in specs:
            parsed = parse_repository(spec)
            self.entries.append(RemoteRepository(parsed, environ) if isinstance(parsed, RemoteLocation) else parsed)
        self._remote = {e.location.spec: e for e in self.entries if isinstance(e, RemoteRepository)}
        self._reported: dict[str, str] = {}  # logged once per change, not on every poll
        self._report_lock = threading.Lock()  # concurrent loads discover at once

    def discover(self) -> Discovery:
        """Scan every repository; a name found in two of them is a duplicate and serves from neither."""
        found: dict[str, list[ModelSource]] = {}
        unavailable: dict[str, str] = {}
        for entry in self.entries:
            if isinstance(entry, Path):
                for name, source in discover([entry]).models.items():
                    found.setdefault(name, []).append(source)
                continue
            try:
                listings = entry.models()
            except RepositoryUnavailable as error:
                unavailable[entry.location.spec] = str(error)
                continue
            for name, listing in listings.items():
                found.setdefault(name, []).append(ModelSource(name, entry.model_path(name), entry.location, listing))
        self._report(unavailable)
        models = {name: sources[0] for name, sources in found.items() if len(sources) == 1}
        duplicates = {name: [s.repository for s in sources] for name, sources in found.items() if len(sources) > 1}
        return Discovery(models, duplicates, unavailable)

    def _report(self, unavailable: dict[str, str]) -> None:
        with self._report_lock:
            for spec, reason in unavailable.items():
                if self._reported.get(spec) != reason:
                    log.error("%s", reason)
            for spec in set(self._reported) - set(unavailable):
                log.info("model repository '%s' is available again", spec)
            self._reported = dict(unavailable)

    def stamp(self, source: ModelSource) -> Fingerprint:
        """What must change for the model to need a reload: its files' sizes and mtimes on disk, or
        its blobs' keys, sizes and ETags in a bucket (no download needed)."""
        if source.listing is None:
            return fingerprint(source.path)
        return self._remote[source.repository.spec].fingerprint(source.name, source.listing)

    def materialize(self, source: ModelSource) -> Path:
        """The local directory to load from: the model itself, or a cache snapshot of its listing.
        RepositoryUnavailable when a download fails."""
        if source.listing is None:
            return source.path
        return self._remote[source.repository.spec].materialize(source.name, source.listing)

    def prune(self, name: str, repository: object, keep: set[Path]) -> None:
        """Drop a remote model's cache snapshots that no serving version uses."""
        if isinstance(repository, RemoteLocation):
            self._remote[repository.spec].prune(name, keep)
