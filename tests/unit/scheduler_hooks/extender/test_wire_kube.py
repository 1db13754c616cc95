"""kube-scheduler extender v1 JSON: requests written by hand from the upstream Go types.

k8s.io/kube-scheduler/extender/v1 has no json tags, so the scheduler writes Go field names
(``Pod``, ``NodeNames``...) around lower-case v1.Pod / v1.Node JSON, and unset pointers as
``null``. Go's decoder matches keys case-insensitively (the upstream TestCompatibility
round-trips ``strings.ToLower`` of the JSON), so the parsers must too.
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core import jsonio
from scheduler_hooks.cluster.kube_json import WireError
from scheduler_hooks.cluster.kube_objects import asks_protection
from scheduler_hooks.cluster.state import ClusterView, KnownPod
from scheduler_hooks.extender.policy import Policy
from scheduler_hooks.extender.wire_kube import (
    filter_error,
    handle_filter,
    handle_preempt,
    handle_prioritize,
    parse_extender_args,
    pod_request,
)
from tests.unit.scheduler_hooks.builders import container, pod_json, sample_placement

POLICY = Policy(
    ClusterView(
        placement=sample_placement(),
        blocked={"team-b": "gpu_hours"},
        pods={
            "spot-1": KnownPod("spot-1", "team-a", Decimal(1), capacity_type="spot"),
            "od-1": KnownPod("od-1", "team-a", Decimal(1)),
            "prot-1": KnownPod("prot-1", "team-a", Decimal(1), protected=True),
        },
        protection_namespaces={"team-a"},  # labelled gpumeter.io/protection-allowed: "true"
    )
)

POD_2_GPUS = """
{"metadata": {"name": "trainer", "namespace": "team-a", "uid": "uid-trainer", "creationTimestamp": null},
 "spec": {"containers": [{"name": "main", "image": "trainer:1",
                          "resources": {"limits": {"nvidia.com/gpu": "2"},
                                        "requests": {"nvidia.com/gpu": "2"}}}],
          "priority": 0},
 "status": {}}
"""

FILTER_NAMES = (
    '{"Pod": ' + POD_2_GPUS + ', "Nodes": null,'
    ' "NodeNames": ["h100-a", "h100-b", "l40s-a", "l40s-b", "mystery"]}'
)


def node(name: str) -> str:
    return (
        '{"metadata": {"name": "' + name + '", "creationTimestamp": null, "labels": {"gpu": "yes"}},'
        ' "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"},'
        ' "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}}}}'
    )


FILTER_NODES = (
    '{"Pod": ' + POD_2_GPUS + ', "Nodes": {"metadata": {"resourceVersion": "42"}, "items": ['
    + ", ".join(node(n) for n in ["h100-a", "l40s-b", "mystery"])
    + ']}, "NodeNames": null}'
)

LACK = "gpumeter: capacity: node has 1 free GPUs, pod needs 2"
GPU = "nvidia.com/gpu"
SIDECAR = container("side", limits=1, restart_policy="Always")


def decode(text: str) -> Any:
    return jsonio.loads(text)


def filtered(document: Any) -> Any:
    """The filter answer as the server sends it (JSON bytes), read back."""
    return json.loads(handle_filter(document, POLICY))


# -- filter ----------------------------------------------------------------------------------


def test_filter_node_names_mode() -> None:
    result = filtered(decode(FILTER_NAMES))
    assert result == {
        "Nodes": None,
        "NodeNames": ["h100-a", "h100-b", "l40s-a", "mystery"],
        "FailedNodes": {"l40s-b": LACK},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    # Every Go field present, unset ones as null.
    assert json.dumps(result).startswith('{"Nodes": null, "NodeNames": [')


def test_filter_full_nodes_mode_returns_the_passing_items() -> None:
    request = decode(FILTER_NODES)
    result = filtered(request)
    items = request["Nodes"]["items"]
    assert result == {
        "Nodes": {"metadata": {"resourceVersion": "42"}, "items": [items[0], items[2]]},
        "NodeNames": None,
        "FailedNodes": {"l40s-b": LACK},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def _summary(result: dict[str, Any]) -> tuple[Any, ...]:
    nodes = result["Nodes"]
    names = None if nodes is None else [item["metadata"]["name"] for item in nodes["items"]]
    return (names, result["NodeNames"], result["FailedNodes"], result["FailedAndUnresolvableNodes"],
            result["Error"])


@pytest.mark.parametrize("text", [FILTER_NAMES, FILTER_NODES], ids=["node-names", "full-nodes"])
def test_filter_accepts_lower_case_keys_like_go(text: str) -> None:
    # The upstream compatibility test lowercases the whole document; our values are lower case already.
    lowered = filtered(decode(text.lower()))
    assert list(lowered) == ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]
    assert _summary(lowered) == _summary(filtered(decode(text)))


def test_filter_both_forms_sent_answers_both() -> None:
    request = decode(FILTER_NODES)
    request["NodeNames"] = ["h100-a", "l40s-b"]
    result = filtered(request)
    assert result["NodeNames"] == ["h100-a"]
    assert [item["metadata"]["name"] for item in result["Nodes"]["items"]] == ["h100-a", "mystery"]


def test_filter_blocked_tenant_is_unresolvable_everywhere() -> None:
    request = decode(FILTER_NAMES)
    request["Pod"]["metadata"]["namespace"] = "team-b"
    result = filtered(request)
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == {"h100-a", "h100-b", "l40s-a", "l40s-b", "mystery"}
    messages = set(result["FailedAndUnresolvableNodes"].values())
    assert messages == {"gpumeter: tenant team-b over gpu_hours quota"}


def _device_pod(resource: str, namespace: str) -> dict[str, Any]:
    return pod_json(namespace=namespace, containers=[
        {"name": "main", "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}}}])


@pytest.mark.parametrize("resource", ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.me",
                                      "nvidia.com/gpu.shared"])
def test_filter_refuses_a_blocked_tenant_its_mig_and_shared_gpu_pods_too(resource: str) -> None:
    # The device plugin hands MIG devices out as nvidia.com/mig-<profile> (mixed strategy) and
    # time-sliced replicas as nvidia.com/gpu.shared when it renames them: no nvidia.com/gpu is
    # asked, yet the pod's hours count against its tenant's quota like any GPU pod's.
    blocked = filtered({"Pod": _device_pod(resource, "team-b"), "NodeNames": ["h100-a", "mystery"]})
    assert blocked["NodeNames"] == []
    assert blocked["FailedAndUnresolvableNodes"] == dict.fromkeys(
        ["h100-a", "mystery"], "gpumeter: tenant team-b over gpu_hours quota")
    allowed = filtered({"Pod": _device_pod(resource, "team-a"), "NodeNames": ["h100-a", "mystery"]})
    assert allowed["NodeNames"] == ["h100-a", "mystery"]
    assert allowed["FailedNodes"] == {} and allowed["FailedAndUnresolvableNodes"] == {}


def test_filter_error_result_has_every_field() -> None:
    assert filter_error("not ready") == {
        "Nodes": None, "NodeNames": None, "FailedNodes": None, "FailedAndUnresolvableNodes": None,
        "Error": "not ready",
    }


# -- prioritize ------------------------------------------------------------------------------


def test_prioritize_host_priority_list() -> None:
    assert handle_prioritize(decode(FILTER_NAMES), POLICY) == [
        {"Host": "h100-a", "Score": 10},
        {"Host": "h100-b", "Score": 9},
        {"Host": "l40s-a", "Score": 5},
        {"Host": "l40s-b", "Score": 0},
        {"Host": "mystery", "Score": 5},
    ]


def test_prioritize_full_nodes_mode() -> None:
    scores = handle_prioritize(decode(FILTER_NODES), POLICY)
    assert scores == [
        {"Host": "h100-a", "Score": 10},
        {"Host": "l40s-b", "Score": 0},
        {"Host": "mystery", "Score": 5},
    ]


# -- preempt ---------------------------------------------------------------------------------

PREEMPT_META = (
    '{"Pod": ' + POD_2_GPUS + ', "NodeNameToVictims": null, "NodeNameToMetaVictims": {'
    '"n1": {"Pods": [{"UID": "spot-1"}], "NumPDBViolations": 0},'
    '"n2": {"Pods": [{"UID": "od-1"}], "NumPDBViolations": 1},'
    '"n3": {"Pods": [{"UID": "spot-1"}, {"UID": "prot-1"}], "NumPDBViolations": 0}}}'
)


def victim(uid: str, annotations: str = "") -> str:
    extra = f', "annotations": {annotations}' if annotations else ""
    return (
        '{"metadata": {"name": "' + uid + '", "namespace": "team-a", "uid": "' + uid + '"' + extra + "},"
        ' "spec": {"containers": null}, "status": {}}'
    )


PREEMPT_FULL = (
    '{"Pod": ' + POD_2_GPUS + ', "NodeNameToVictims": {'
    '"n1": {"Pods": [' + victim("ghost", '{"gpumeter.io/protected": "true"}') + '], "NumPDBViolations": 0},'
    '"n2": {"Pods": [' + victim("od-1") + '], "NumPDBViolations": 2}}, "NodeNameToMetaVictims": null}'
)


def test_preempt_meta_victims_prefers_spot() -> None:
    assert handle_preempt(decode(PREEMPT_META), POLICY) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "spot-1"}], "NumPDBViolations": 0}}
    }


def test_preempt_full_victims_answers_meta_form_and_reads_annotations() -> None:
    assert handle_preempt(decode(PREEMPT_FULL), POLICY) == {
        "NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": "od-1"}], "NumPDBViolations": 2}}
    }


@pytest.mark.security
def test_preempt_ignores_the_annotation_where_the_namespace_does_not_allow_protection() -> None:
    unlabelled = Policy(replace(POLICY.view, protection_namespaces=frozenset()))
    assert handle_preempt(decode(PREEMPT_FULL), unlabelled) == {
        "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "ghost"}], "NumPDBViolations": 0},
            "n2": {"Pods": [{"UID": "od-1"}], "NumPDBViolations": 2},
        }
    }


def test_preempt_lower_case_keys() -> None:
    lowered = handle_preempt(decode(PREEMPT_META.lower()), POLICY)
    assert lowered == handle_preempt(decode(PREEMPT_META), POLICY)


def test_preempt_nothing_left_is_an_empty_map() -> None:
    request = decode(PREEMPT_META)
    request["NodeNameToMetaVictims"] = {"n3": request["NodeNameToMetaVictims"]["n3"], "n4": None}
    assert handle_preempt(request, POLICY) == {"NodeNameToMetaVictims": {}}


# -- v1.Pod -> PodRequest --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "gpus"),
    [
        (pod_json(), 0),
        (pod_json(gpus=2), 2),
        (pod_json(gpus="2000m"), 2),
        (pod_json(gpus="0.5"), 1),  # not valid Kubernetes, but never fewer GPUs than asked
        (pod_json(containers=[container("a", requests=1)]), 1),
        # The kubelet reads the request; a limit only stands in for a missing one (the API server
        # refuses an extended resource whose request and limit differ, so this pod never exists).
        (pod_json(containers=[container("a", limits=2, requests=1)]), 1),
        (pod_json(containers=[container("a", limits=1), container("b", limits=2)]), 3),
        (pod_json(containers=[container("a", limits=2)], init_containers=[container("i", limits=4)]), 4),
        (pod_json(containers=[container("a", limits=3)], init_containers=[container("i", limits=1)]), 3),
        (  # a sidecar (restartPolicy Always) runs beside the later init container and the app
            pod_json(
                containers=[container("a", limits=1)],
                init_containers=[SIDECAR, container("i", limits=3)],
            ),
            4,
        ),
        (  # sidecar after the init container: init peak 3, then app 2 + sidecar 1
            pod_json(
                containers=[container("a", limits=2)],
                init_containers=[container("i", limits=3), SIDECAR],
            ),
            3,
        ),
        ({"metadata": {"name": "n"}, "spec": {"containers": [{"resources": {"limits": {GPU: 2}}}]}}, 2),
    ],
    ids=[
        "no-gpu", "limits-and-requests", "milli-suffix", "fraction-rounds-up", "requests-only",
        "request-wins-over-limit", "containers-sum", "init-container-larger", "containers-larger",
        "sidecar-beside-init", "sidecar-after-init", "number-quantity",
    ],
)
def test_pod_gpus(pod: dict[str, Any], gpus: int) -> None:
    assert pod_request(pod).gpus == gpus


@pytest.mark.parametrize(
    ("resources", "gpus", "other"),
    [
        ({"nvidia.com/mig-1g.10gb": "1"}, 0, 1),
        ({"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "1"}, 0, 3),
        ({"nvidia.com/gpu.shared": "1"}, 0, 1),
        ({"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "1"}, 2, 1),
        ({"nvidia.com/mig-1g.10gb": "0"}, 0, 0),
        ({"example.com/fpga": "1", "cpu": "2"}, 0, 0),
    ],
    ids=["mig", "two-profiles", "shared-rename", "both", "zero", "not-a-gpu"],
)
def test_pod_other_gpu_devices(resources: dict[str, str], gpus: int, other: int) -> None:
    request = pod_request(pod_json(containers=[{"name": "m", "resources": {"limits": resources}}]))
    assert (request.gpus, request.other_gpu_devices) == (gpus, other)


def test_a_malformed_mig_quantity_is_a_wire_error_naming_it() -> None:
    limits = {"nvidia.com/mig-1g.10gb": "lots"}
    document = pod_json(containers=[{"name": "m", "resources": {"limits": limits}}])
    with pytest.raises(WireError, match=r"nvidia.com/mig-1g.10gb.*not a resource quantity"):
        pod_request(document)


def test_pod_request_fields() -> None:
    request = pod_request(
        pod_json(namespace="ml", name="p", uid="u", gpus=1, priority=1000,
                 annotations={"gpumeter.io/protected": "TRUE", "other": "x"})
    )
    assert (request.namespace, request.name, request.uid, request.priority) == ("ml", "p", "u", 1000)
    assert asks_protection(request.annotations)
    unprotected = pod_request(pod_json(annotations={"gpumeter.io/protected": "false"}))
    assert not asks_protection(unprotected.annotations)
    assert pod_request({"metadata": {"name": "bare"}}).namespace == "default"


def test_parse_extender_args_keeps_both_forms() -> None:
    args = parse_extender_args(decode(FILTER_NODES))
    assert args.sent_names is None
    assert args.node_names == ["h100-a", "l40s-b", "mystery"]
    assert args.pod.gpus == 2


# -- malformed input -------------------------------------------------------------------------


def _filter_with(**changes: Any) -> dict[str, Any]:
    request = decode(FILTER_NAMES)
    request.update(changes)
    return request


def _pod_with(path: list[str], value: Any) -> dict[str, Any]:
    request = decode(FILTER_NAMES)
    target = request["Pod"]
    for key in path[:-1]:
        target = target[key] if not isinstance(target, list) else target[int(key)]
    target[path[-1]] = value
    return request


MALFORMED = [
    ("not-an-object", [], "ExtenderArgs must be a JSON object, got array"),
    ("pod-missing", {"NodeNames": ["a"]}, "ExtenderArgs.Pod is missing"),
    ("pod-null", _filter_with(Pod=None), "ExtenderArgs.Pod is missing"),
    ("pod-not-object", _filter_with(Pod="trainer"), "Pod must be a JSON object, got string"),
    ("node-names-not-array", _filter_with(NodeNames="h100-a"), "NodeNames must be a JSON array"),
    ("node-name-not-string", _filter_with(NodeNames=["a", 1]), "NodeNames[1] must be a string"),
    ("nodes-not-object", _filter_with(NodeNames=None, Nodes=[]), "Nodes must be a JSON object"),
    ("node-without-name", _filter_with(Nodes={"items": [{"metadata": {}}]}), "Nodes.items[0].metadata.name"),
    ("containers-not-array", _pod_with(["spec", "containers"], {}), "Pod.spec.containers must be a JSON"),
    (
        "bad-quantity",
        _pod_with(["spec", "containers", "0", "resources", "limits", "nvidia.com/gpu"], "two"),
        "is not a resource quantity: 'two'",
    ),
    (
        "negative-quantity",
        _pod_with(["spec", "containers", "0", "resources", "limits", "nvidia.com/gpu"], -1),
        "must not be negative",
    ),
    ("priority-not-integer", _pod_with(["spec", "priority"], "high"), "Pod.spec.priority must be an integer"),
    ("priority-fraction", _pod_with(["spec", "priority"], Decimal("1.5")), "Pod.spec.priority must be an"),
    (
        "annotation-not-string",
        _pod_with(["metadata", "annotations"], {"gpumeter.io/protected": True}),
        "Pod.metadata.annotations['gpumeter.io/protected'] must be a string",
    ),
]


@pytest.mark.parametrize(
    ("document", "reason"), [(d, r) for _, d, r in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
def test_malformed_extender_args(document: Any, reason: str) -> None:
    with pytest.raises(WireError) as raised:
        handle_filter(document, POLICY)
    assert reason in raised.value.reason


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ({"NodeNameToMetaVictims": {}}, "ExtenderPreemptionArgs.Pod is missing"),
        ({"Pod": {}, "NodeNameToMetaVictims": "n1"}, "NodeNameToMetaVictims must be a JSON object"),
        ({"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}}, "['n1'].Pods[0].UID must be a string"),
        ({"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": {}}}}, "['n1'].Pods must be a JSON array"),
        ({"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {}}]}}}, "Pods[0].metadata.uid is"),
        (
            {"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": "1"}}},
            "NumPDBViolations must be an integer",
        ),
    ],
    ids=["pod-missing", "meta-not-object", "uid-missing", "pods-not-array", "full-pod-no-uid", "pdb-string"],
)
def test_malformed_preemption_args(document: Any, reason: str) -> None:
    with pytest.raises(WireError) as raised:
        handle_preempt(document, POLICY)
    assert reason in raised.value.reason
