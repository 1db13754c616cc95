"""An operation refused by the cluster's ACLs, said in one line: who, what, what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from gpumeter.core.settings import KafkaSettings
from gpumeter.infra.kafka import refusal

pytestmark = pytest.mark.security


def sasl(tmp_path: Path) -> KafkaSettings:
    password = tmp_path / "password"
    password.write_text("never-shown\n")
    return KafkaSettings(bootstrap="k1:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                         sasl_username="tenant-x", sasl_password_file=password)


def test_a_refused_topic_names_the_user_the_error_and_the_topic(tmp_path: Path) -> None:
    line = refusal(sasl(tmp_path), TopicAuthorizationFailedError("p.gpumeter.usage.samples.v1"))
    assert "\n" not in line and "never-shown" not in line
    assert "k1:9093" in line and "'tenant-x'" in line
    assert "TopicAuthorizationFailedError (p.gpumeter.usage.samples.v1)" in line


def test_a_plaintext_client_is_named_by_its_protocol() -> None:
    line = refusal(KafkaSettings(), GroupAuthorizationFailedError("g"))
    assert "this PLAINTEXT client" in line and "GroupAuthorizationFailedError (g)" in line

