"""Rate cards picked up while the worker runs (a new card deployed, a card corrected).

Contract 3.2 prices a sample by the card in force at its ``window_start``: a card added for
a future date, or corrected for the open month, must apply without a restart. The watcher
re-reads the file or directory when its content changes; a set that does not load is refused
with one line naming the file and the field, and the last good set stays in force.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from gpumeter.core.config_files import ConfigError
from gpumeter.core.ratecard import RateCardSet, load_rate_cards

log = logging.getLogger("gpumeter.worker")


class RateCardWatcher:
    def __init__(self, path: Path) -> None:
        """Load now: a bad set at start raises ConfigError (there is no last good one)."""
        self.path = path
        self._digest = self._read_digest()  # before loading: a change in between is seen next poll
        self.current = load_rate_cards(path)

    def poll(self) -> RateCardSet | None:
        """The new set when the files changed and load; None when unchanged or refused."""
        digest = self._read_digest()
        if digest == self._digest:
            return None
        self._digest = digest
        try:
            loaded = load_rate_cards(self.path)
        except ConfigError as exc:
            log.error("rate cards refused, the last good set stays in force: %s", " ".join(str(exc).split()))
            return None
        self.current = loaded
        versions = ", ".join(card.version for card in loaded.cards)
        log.warning("rate cards reloaded from %s: %s", self.path, versions)
        return loaded

    def _read_digest(self) -> str:
        digest = hashlib.sha256()
        try:
            files = sorted(self.path.iterdir()) if self.path.is_dir() else [self.path]
            for file in files:
                if file.suffix in (".yaml", ".yml") or not self.path.is_dir():
                    digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
        except OSError as exc:
            return f"unreadable: {exc.strerror}"  # refused once, re-read when it reappears
        return digest.hexdigest()
