"""Bearer tokens of the invoice API (contract 7): a tokens file of SHA-256 digests, never tokens.

```yaml
tokens:
  - {sha256: "<64 hex>", tenant: team-a}    # sees team-a's invoices and usage only
  - {sha256: "<64 hex>", role: finance}     # sees every tenant's
```
``gpumeter api`` re-reads the file when it changes, so tokens rotate without a restart. A file
that goes missing, cannot be read or stops being valid is reported and then no token is valid
(401 for all, contract 7): deleting the file is how an operator revokes every token at once.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpumeter.core.config_files import ConfigError, read_yaml, validation_failure
from gpumeter.core.validation import TENANT_PATTERN

log = logging.getLogger(__name__)


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    tenant: Annotated[str, Field(pattern=TENANT_PATTERN)] | None = None
    role: Literal["finance"] | None = None

    @field_validator("sha256", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_scope(self) -> TokenEntry:
        if (self.tenant is None) == (self.role is None):
            raise ValueError("a token has either a tenant or role: finance")
        return self


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: list[TokenEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> TokensFile:
        digests = [entry.sha256 for entry in self.tokens]
        if len(set(digests)) != len(digests):
            raise ValueError("a sha256 digest is listed more than once")
        return self


@dataclass(frozen=True)
class Caller:
    """Who a valid token speaks for: one tenant, or finance (every tenant)."""

    tenant: str | None
    finance: bool

    def may_see(self, tenant: str) -> bool:
        return self.finance or self.tenant == tenant


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def load_tokens(path: Path) -> dict[str, Caller]:
    document = read_yaml(path)
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a tokens file is a YAML mapping with a 'tokens' list")
    try:
        parsed = TokensFile.model_validate(document)
    except ValidationError as exc:
        raise validation_failure(path, exc) from None
    return {entry.sha256: Caller(entry.tenant, entry.role == "finance") for entry in parsed.tokens}


class Tokens:
    """The tokens file, re-read when its modification time or size changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._callers: dict[str, Caller] = {}
        if path is not None:
            self._callers = load_tokens(path)  # a bad file at start-up is the operator's error
            self._stamp = self._stat()

    def caller(self, token: str) -> Caller | None:
        self._refresh()
        return self._callers.get(digest(token))

    def _stat(self) -> tuple[int, int] | None:
        assert self.path is not None
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)

    def _refresh(self) -> None:
        if self.path is None:
            return
        stamp = self._stat()
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            try:
                self._callers = load_tokens(self.path)
            except (ConfigError, OSError) as exc:
                self._callers = {}
                log.error("tokens file unusable, no token is valid until it is fixed: %s", exc)
            self._stamp = stamp
