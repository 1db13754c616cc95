"""Our podresources_v1.proto against upstream's, not against itself: the field table of the kubelet's
``api.proto`` (data/podresources_v1_upstream.json, transcribed from kubernetes/kubernetes at the
commit it names) compared with the descriptor protoc generates from our file. A wrong field number or
type would decode the kubelet's bytes into the wrong field, silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from collectors.agent.proto.generate import load

pytestmark = pytest.mark.agent

GOLDEN = Path(__file__).parent / "data" / "podresources_v1_upstream.json"
SCALARS = {"string": "TYPE_STRING", "int64": "TYPE_INT64", "uint64": "TYPE_UINT64"}
LABELS = {"optional": "LABEL_OPTIONAL", "repeated": "LABEL_REPEATED"}


def ours() -> descriptor_pb2.FileDescriptorProto:
    pb2, _ = load()
    proto = descriptor_pb2.FileDescriptorProto()
    pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def field_table(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, dict[str, tuple[int, str, str]]]:
    types = descriptor_pb2.FieldDescriptorProto.Type
    labels = descriptor_pb2.FieldDescriptorProto.Label
    table: dict[str, dict[str, tuple[int, str, str]]] = {}
    for message in proto.message_type:
        fields = {}
        for f in message.field:
            kind = f.type_name.rsplit(".", 1)[-1] if f.type_name else types.Name(f.type)
            fields[f.name] = (f.number, kind, labels.Name(f.label))
        table[message.name] = fields
    return table


def expected_table() -> dict[str, dict[str, tuple[int, str, str]]]:
    return {
        message: {
            name: (number, SCALARS.get(kind, kind), LABELS[label])
            for name, (number, kind, label) in fields.items()
        }
        for message, fields in golden()["messages"].items()
    }


def test_every_message_and_field_matches_upstreams_number_type_and_label() -> None:
    assert ours().package == golden()["package"]
    assert field_table(ours()) == expected_table()


def test_the_service_methods_are_upstreams() -> None:
    (service,) = ours().service
    methods = {
        m.name: [m.input_type.rsplit(".", 1)[-1], m.output_type.rsplit(".", 1)[-1]] for m in service.method
    }
    assert {service.name: methods} == golden()["services"]


def test_upstreams_tombstoned_numbers_are_never_reused() -> None:
    table = field_table(ours())
    for message, numbers in golden()["reserved"].items():
        used = {number for number, _kind, _label in table[message].values()}
        assert not used & set(numbers), f"{message} reuses a removed field number"
