"""The tenants file as the actuator reads it: re-read when it changes, the last good one kept."""

from __future__ import annotations

import logging
from pathlib import Path

from gpumeter.core.config_files import ConfigError
from gpumeter.core.tenants import TenantsFile, load_tenants

log = logging.getLogger("gpumeter.actuator")


class TenantsSource:
    """The tenants file, re-read when its mtime or size changes.

    A file that does not parse is refused with one line naming it and the field, and the last
    good one stays in force (issue 9, item 7).
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._current = load_tenants(path)  # the first load must succeed: no last good one yet
        self._stamp = self._read_stamp()

    def current(self) -> TenantsFile:
        return self._current

    def poll(self) -> bool:
        """Reload if the file changed; True when a new version took effect."""
        stamp = self._read_stamp()
        if self._path is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            self._current = load_tenants(self._path)
        except ConfigError as exc:
            log.error("tenants file refused, the last good one stays in force: %s", exc)
            return False
        log.info("tenants file %s reloaded: %d tenants", self._path, len(self._current.tenants))
        return True

    def _read_stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            info = self._path.stat()
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size
