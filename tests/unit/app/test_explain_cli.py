"""`gpumeter explain pod`: where it asks the extender, and the NS/NAME argument (bad input is
exit 2 with one line, before any service is reached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumeter.app.cli import main
from gpumeter.app.cli.explain import extender_url
from gpumeter.core.settings import Settings


@pytest.mark.parametrize(("changes", "url"), [
    ({}, "http://127.0.0.1:8790"),
    ({"hooks": {"listen": "0.0.0.0:9000", "allow_plaintext": True}}, "http://127.0.0.1:9000"),
    ({"hooks": {"listen": "10.0.0.5:8790", "tls_cert": "/c.pem", "tls_key": "/k.pem"}}, "https://10.0.0.5:8790"),
    ({"explain": {"extender_url": "https://gpumeter-extender.gpumeter-system.svc:8790/"}},
     "https://gpumeter-extender.gpumeter-system.svc:8790"),
])
def test_the_extender_is_asked_where_the_hooks_listen_unless_told(changes: dict[str, object],
                                                                  url: str) -> None:
    assert extender_url(Settings.model_validate(changes)) == url


@pytest.mark.parametrize("argument",
                         ["trainer", "ml/", "/trainer", "ml/trainer/x", "ML/trainer", "ml/Trainer"])
def test_an_argument_that_is_not_ns_slash_name_is_exit_2_with_one_line(
    argument: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))  # never reached
    assert main(["explain", "pod", argument]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected NS/NAME" in err
