"""The invoice API's tokens file: digests only, one scope per token, one-line errors naming the
file and the field, and a reload when the file changes that never drops valid tokens for a bad file."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumeter.core.config_files import ConfigError
from pricing.http.auth import Caller, Tokens, load_tokens

pytestmark = pytest.mark.security


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_digests_map_to_a_tenant_or_finance(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        f"tokens:\n  - {{sha256: {sha('a-token').upper()}, tenant: team-a}}\n"
        f"  - {{sha256: {sha('f-token')}, role: finance}}\n"
    )
    tokens = Tokens(path)
    assert tokens.caller("a-token") == Caller("team-a", False)
    assert tokens.caller("f-token") == Caller(None, True)
    assert tokens.caller(sha("a-token")) is None  # the digest itself is not a token
    assert tokens.caller("") is None
    assert Caller("team-a", False).may_see("team-a") and not Caller("team-a", False).may_see("team-b")
    assert Caller(None, True).may_see("anyone")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param(
            "tokens:\n  - {sha256: abc, tenant: team-a}\n", "tokens.0.sha256", id="not-a-sha256-digest"
        ),
        pytest.param(
            f"tokens:\n  - {{sha256: {sha('x')}}}\n",
            "tokens.0: a token has either a tenant or role: finance",
            id="neither-tenant-nor-role",
        ),
        pytest.param(
            f"tokens:\n  - {{sha256: {sha('x')}, tenant: a, role: finance}}\n",
            "either a tenant or role",
            id="both-tenant-and-role",
        ),
        pytest.param(
            f"tokens:\n  - {{sha256: {sha('x')}, role: admin}}\n", "tokens.0.role", id="unknown-role"
        ),
        pytest.param(
            f"tokens:\n  - {{sha256: {sha('x')}, tenant: Team_A}}\n", "tokens.0.tenant", id="invalid-tenant"
        ),
        pytest.param(
            f"tokens:\n  - {{sha256: {sha('x')}, tenant: a}}\n  - {{sha256: {sha('x')}, tenant: b}}\n",
            "a sha256 digest is listed more than once",
            id="digest-listed-twice",
        ),
        pytest.param(
            "tokens:\n  - {token: secret, tenant: a}\n",
            "tokens.0.token: Extra inputs are not permitted",
            id="plain-token-instead-of-digest",
        ),
        pytest.param("- just a list\n", "a tokens file is a YAML mapping", id="not-a-mapping"),
    ],
)
def test_a_bad_tokens_file_is_one_line_naming_the_file_and_field(
    tmp_path: Path, body: str, needle: str
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as caught:
        load_tokens(path)
    assert str(caught.value).startswith(f"{path}: ") and needle in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{sha256: {sha('old')}, tenant: team-a}}\n")
    tokens = Tokens(path)
    assert tokens.caller("old") is not None
    path.write_text(f"tokens:\n  - {{sha256: {sha('new')}, tenant: team-a}}\n  # rotated\n")
    os.utime(path, ns=(1, 1))  # a distinct stamp even on a coarse clock
    assert tokens.caller("new") == Caller("team-a", False) and tokens.caller("old") is None


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda path: path.unlink(), id="deleted"),
        pytest.param(lambda path: path.write_text("tokens: [{sha256: nope}]\n"), id="invalid"),
        # Unreadable even for root (the suite runs as root in CI, where a file mode is no bar).
        pytest.param(lambda path: (path.unlink(), path.mkdir()), id="unreadable"),
        pytest.param(lambda path: path.write_text("tokens: [\n"), id="not-yaml"),
    ],
)
def test_a_tokens_file_that_goes_missing_or_bad_revokes_every_token(
    tmp_path: Path, spoil: Callable[[Path], object]
) -> None:
    """Contract 7 (amended): deleting the file is how an operator revokes every token at once;
    keeping the last good set (as before) left revoked tokens valid."""
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{sha256: {sha('t')}, tenant: team-a}}\n")
    tokens = Tokens(path)
    assert tokens.caller("t") == Caller("team-a", False)
    spoil(path)
    if path.exists():
        os.utime(path, ns=(3, 3))
    assert tokens.caller("t") is None
    # A good file again restores access.
    if path.is_dir():
        path.rmdir()
    path.write_text(f"tokens:\n  - {{sha256: {sha('t')}, tenant: team-a}}\n")
    os.utime(path, ns=(4, 4))
    assert tokens.caller("t") == Caller("team-a", False)


def test_no_tokens_file_means_no_valid_token() -> None:
    assert Tokens(None).caller("anything") is None
