"""Volcano extender plugin JSON: envelopes from argument.go, contents from pkg/scheduler/api.

Volcano's TaskInfo / NodeInfo / QueueInfo / JobInfo have no json tags, so they travel with Go
field names (``UID``, ``Resreq``, ``ScalarResources``...), GPUs in milli-units (1000 = 1 GPU),
around lower-case v1.Pod / v1.Node JSON. No vc-scheduler can be built here (the Go module
proxy refuses volcano.sh), so the requests are written by hand from those types.
"""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any

import pytest

from gpumeter.core import jsonio
from scheduler_hooks.cluster.kube_json import WireError
from scheduler_hooks.cluster.state import ClusterView, KnownPod
from scheduler_hooks.extender.policy import Policy
from scheduler_hooks.extender.wire_volcano import (
    handle_job_enqueueable,
    handle_job_ready,
    handle_predicate,
    handle_preemptable,
    handle_prioritize,
    handle_queue_overused,
    handle_reclaimable,
)
from tests.unit.scheduler_hooks.builders import node_info_json, sample_placement, task_json

POLICY = Policy(
    ClusterView(
        placement=sample_placement(),
        blocked={"team-b": "spend"},
        pods={
            "spot-1": KnownPod("spot-1", "team-a", Decimal(1), capacity_type="spot"),
            "od-1": KnownPod("od-1", "team-a", Decimal(1), priority=10),
        },
        protection_namespaces={"team-a"},  # labelled gpumeter.io/protection-allowed: "true"
    )
)
GPU = "nvidia.com/gpu"

# A predicate request as Go's encoding/json writes it, abridged to the fields that carry data.
PREDICATE = """
{"task": {"UID": "uid-trainer", "Job": "team-a/job-trainer", "Name": "trainer", "Namespace": "team-a",
          "TaskRole": "worker",
          "Resreq": {"MilliCPU": 4000, "Memory": 17179869184, "ScalarResources": {"nvidia.com/gpu": 2000},
                     "MaxTaskNum": 0},
          "InitResreq": {"MilliCPU": 4000, "Memory": 17179869184, "ScalarResources": {"nvidia.com/gpu": 2000},
                         "MaxTaskNum": 0},
          "NodeName": "", "EvictionOccurred": false, "JobAllocatedHyperNode": "", "Status": 1,
          "LastTransaction": null, "Priority": 1, "VolumeReady": false, "Preemptable": false,
          "BestEffort": false, "HasRestartableInitContainer": false, "SchGated": false, "RevocableZone": "",
          "NumaInfo": null,
          "Pod": {"metadata": {"name": "trainer", "namespace": "team-a", "uid": "uid-trainer"},
                  "spec": {"containers": [{"name": "main",
                                           "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
                  "status": {"phase": "Pending"}},
          "CustomBindErrHandlerSucceeded": false},
 "node": {"Name": "NODE", "Node": {"metadata": {"name": "NODE"}, "spec": {}, "status": {}},
          "State": {"Phase": 1, "Reason": ""},
          "Idle": {"MilliCPU": 96000, "Memory": 1099511627776, "ScalarResources": {"nvidia.com/gpu": 8000},
                   "MaxTaskNum": 110},
          "Used": {"MilliCPU": 0, "Memory": 0, "ScalarResources": null, "MaxTaskNum": 0},
          "Tasks": {}, "Others": {}}}
"""


def predicate(node: str, namespace: str = "team-a") -> dict[str, Any]:
    request = jsonio.loads(PREDICATE.replace("NODE", node))
    request["task"]["Namespace"] = namespace
    request["task"]["Pod"]["metadata"]["namespace"] = namespace
    return request


# -- predicate -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "namespace", "expected"),
    [
        ("h100-b", "team-a", {"status": "", "code": 0}),
        ("mystery", "team-a", {"status": "", "code": 0}),
        ("l40s-b", "team-a", {"status": "gpumeter: capacity: node has 1 free GPUs, pod needs 2", "code": 2}),
        ("h100-b", "team-b", {"status": "gpumeter: tenant team-b over spend quota", "code": 3}),
    ],
    ids=["fits", "unknown-node", "too-few-gpus", "blocked-tenant"],
)
def test_predicate(node: str, namespace: str, expected: dict[str, Any]) -> None:
    assert handle_predicate(predicate(node, namespace), POLICY) == expected


def test_predicate_lower_case_keys_and_float_numbers() -> None:
    lowered = json.loads(PREDICATE.replace("NODE", "l40s-b").lower())  # stdlib: numbers as float/int
    lowered["task"]["resreq"]["scalarresources"] = {GPU: 2000.0}  # map keys are data, not fields
    assert handle_predicate(lowered, POLICY)["code"] == 2


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda task: task.update(Resreq=None, InitResreq=None), 2),  # falls back to the Pod: 2 GPUs
        (lambda task: task.update(Resreq=None), 2),  # InitResreq: 2000 milli
        (lambda task: task["Resreq"].update(ScalarResources=None), 0),  # Resreq says no GPU
        (lambda task: task["Resreq"]["ScalarResources"].update({GPU: 500}), 0),  # a fraction rounds up to 1
    ],
    ids=["from-pod", "from-init-resreq", "no-scalars", "milli-fraction"],
)
def test_predicate_gpu_sources(change: Any, code: int) -> None:
    request = predicate("l40s-b")  # 1 GPU free
    change(request["task"])
    assert handle_predicate(request, POLICY)["code"] == code


MIG = "nvidia.com/mig-1g.10gb"


@pytest.mark.parametrize(
    ("namespace", "expected"),
    [("team-b", {"status": "gpumeter: tenant team-b over spend quota", "code": 3}),
     ("team-a", {"status": "", "code": 0})],
    ids=["blocked-tenant", "ok-tenant"],
)
def test_predicate_of_a_mig_task(namespace: str, expected: dict[str, Any]) -> None:
    # A MIG task asks its profile's resource, no nvidia.com/gpu: still a GPU task a blocked
    # tenant is refused; an unblocked one passes a node with no whole GPU free (l40s-b: 1).
    request = predicate("l40s-b", namespace)
    for key in ("Resreq", "InitResreq"):
        request["task"][key]["ScalarResources"] = {MIG: 1000}
    assert handle_predicate(request, POLICY) == expected


# -- prioritize ------------------------------------------------------------------------------


def test_prioritize_node_scores() -> None:
    nodes = [node_info_json(n) for n in ["h100-a", "h100-b", "l40s-b"]]
    request = {"task": task_json(milli_gpus=2000), "nodes": nodes}
    assert handle_prioritize(request, POLICY) == {
        "nodeScore": {"h100-a": 100, "h100-b": 90, "l40s-b": 0},
        "errorMessage": "",
    }


@pytest.mark.parametrize("nodes", [[], None], ids=["empty", "null"])
def test_prioritize_never_answers_null_scores(nodes: Any) -> None:
    assert handle_prioritize({"task": task_json(milli_gpus=1000), "nodes": nodes}, POLICY) == {
        "nodeScore": {},
        "errorMessage": "",
    }


# -- preemptable / reclaimable ---------------------------------------------------------------


@pytest.mark.parametrize(
    "handler", [handle_preemptable, handle_reclaimable], ids=["preemptable", "reclaimable"]
)
@pytest.mark.parametrize(
    ("guarded_namespace", "victims"),
    [
        pytest.param("team-a", ["spot-1", "od-1"], id="namespace-allows-protection"),
        # priority 1 (task_json's default) is below od-1's 10: it goes before od-1.
        pytest.param("team-z", ["spot-1", "guarded", "od-1"], id="namespace-does-not"),
    ],
)
def test_victims_drop_protected_and_put_preferred_first(handler: Any, guarded_namespace: str,
                                                        victims: list[str]) -> None:
    od = task_json(uid="od-1", name="od", milli_gpus=1000, priority=10)
    guarded = task_json(uid="guarded", name="guarded", milli_gpus=1000, namespace=guarded_namespace,
                        annotations={"gpumeter.io/protected": "true"})
    spot = task_json(uid="spot-1", name="spot", milli_gpus=1000)
    request = {"evictor": task_json(milli_gpus=1000, priority=100), "evictees": [od, guarded, spot]}
    answer = handler(request, POLICY)
    assert answer["status"] == 1
    assert [victim["UID"] for victim in answer["victims"]] == victims
    assert answer["victims"][0] is spot  # handed back as sent: Volcano intersects victims by UID


def test_victims_of_a_refused_evictor() -> None:
    request = {"evictor": task_json(namespace="team-b", milli_gpus=1000), "evictees": [task_json(uid="od-1")]}
    assert handle_preemptable(request, POLICY) == {"status": 1, "victims": []}


# -- queues and jobs -------------------------------------------------------------------------


def queue(name: str) -> dict[str, Any]:
    return {
        "UID": name, "Name": name, "Scope": "cluster", "Namespace": "", "Weight": 1, "Capability": None,
        "Queue": {"kind": "Queue", "name": name, "Spec": {"Weight": 1}, "Status": {"State": "Open"}},
    }


@pytest.mark.parametrize(
    ("request_", "overused"),
    [
        ({"queue": queue("gpumeter-team-b")}, True),
        ({"queue": queue("gpumeter-team-a")}, False),
        ({"queue": queue("default")}, False),
        ({"queue": {"Queue": {"name": "gpumeter-team-b"}}}, True),  # name only on the source Queue
    ],
    ids=["blocked-tenant-queue", "ok-tenant-queue", "other-queue", "name-from-source-queue"],
)
def test_queue_overused(request_: dict[str, Any], overused: bool) -> None:
    assert handle_queue_overused(request_, POLICY) == {"overused": overused}


def job(namespace: str, min_gpus: str | None = None, tasks: dict[str, Any] | None = None) -> dict[str, Any]:
    empty = {"MilliCPU": 0, "Memory": 0, "ScalarResources": None, "MaxTaskNum": 0}
    return {
        "UID": f"{namespace}/job-1", "PgUID": "pg-1", "Name": "job-1", "Namespace": namespace,
        "Queue": f"gpumeter-{namespace}", "Priority": 0, "MinAvailable": 2, "WaitingTime": None,
        "JobFitErrors": "", "NodesFitErrors": {}, "TaskStatusIndex": {}, "Tasks": tasks or {},
        "TaskMinAvailable": {}, "TaskMinAvailableTotal": 0, "Allocated": empty, "TotalRequest": empty,
        "CreationTimestamp": "2026-11-05T08:00:00Z",
        "PodGroup": {
            "kind": "PodGroup", "apiVersion": "scheduling.volcano.sh/v1beta1", "name": "job-1",
            "namespace": namespace, "creationTimestamp": None,
            "Spec": {"MinMember": 2, "MinTaskMember": None, "Queue": f"gpumeter-{namespace}",
                     "PriorityClassName": "", "MinResources": {GPU: min_gpus} if min_gpus else None},
            "Status": {"Phase": "Pending", "Conditions": None, "Running": 0, "Succeeded": 0, "Failed": 0},
            "Version": "v1beta1",
        },
        "ScheduleStartTimestamp": None, "Preemptable": False, "RevocableZone": "", "Budget": None,
    }


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        ({"job": job("team-b", min_gpus="4")}, -1),
        ({"job": job("team-b", tasks={"t1": task_json(uid="t1", namespace="team-b", milli_gpus=1000)})}, -1),
        ({"job": job("team-b")}, 0),  # a CPU-only job of a blocked tenant is not this hook's business
        ({"job": job("team-a", min_gpus="4")}, 0),
        ({"job": job("team-b") | {"TotalRequest": {"MilliCPU": 0, "Memory": 0,
                                                    "ScalarResources": {MIG: 2000}, "MaxTaskNum": 0}}}, -1),
        ({"job": job("team-b") | {"PodGroup": job("team-b")["PodGroup"] | {
            "Spec": {"MinMember": 1, "Queue": "gpumeter-team-b", "MinResources": {MIG: "1"}}}}}, -1),
    ],
    ids=["blocked-min-resources", "blocked-task-gpus", "blocked-cpu-job", "ok-tenant", "blocked-mig-total",
         "blocked-mig-min-resources"],
)
def test_job_enqueueable(request_: dict[str, Any], status: int) -> None:
    assert handle_job_enqueueable(request_, POLICY) == {"status": status}


def test_job_ready_has_no_opinion() -> None:
    assert handle_job_ready({"job": job("team-b", min_gpus="4")}, POLICY) == {"status": True}


# -- malformed input -------------------------------------------------------------------------


def _broken(path: list[str], value: Any) -> dict[str, Any]:
    request = copy.deepcopy(predicate("h100-b"))
    target = request
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return request


@pytest.mark.parametrize(
    ("handler", "document", "reason"),
    [
        (handle_predicate, [], "predicate request must be a JSON object, got array"),
        (handle_predicate, {"node": node_info_json("h100-b")}, "predicate request needs 'task'"),
        (handle_predicate, _broken(["node"], {"Name": ""}), "node has no Name"),
        (handle_predicate, _broken(["task", "Resreq", "ScalarResources"], []), "Resreq.ScalarResources must"),
        (handle_predicate, _broken(["task", "Resreq", "ScalarResources", GPU], -1), "must not be negative"),
        (handle_predicate, _broken(["task", "Resreq", "ScalarResources", GPU], "2"), "must be a number"),
        (handle_predicate, _broken(["task", "Priority"], "high"), "task.Priority must be an integer"),
        (handle_predicate, _broken(["task", "Pod", "spec"], "x"), "task.Pod.spec must be a JSON object"),
        (handle_prioritize, {"task": task_json(), "nodes": {}}, "nodes must be a JSON array"),
        (handle_preemptable, {"evictor": task_json(), "evictees": [{"Name": "x"}]}, "evictees[0].UID is"),
        (handle_reclaimable, {"evictees": []}, "reclaimable request needs 'evictor'"),
        (handle_queue_overused, {"queue": {"Weight": 1}}, "queue has no Name"),
        (handle_job_enqueueable, {"job": job("team-b", min_gpus="lots")}, "is not a resource quantity"),
        (handle_job_ready, {}, "jobReady request needs 'job'"),
    ],
    ids=[
        "not-object", "task-missing", "node-unnamed", "scalars-not-object", "negative-milli", "milli-string",
        "priority-string", "pod-spec-string", "nodes-not-array", "evictee-without-uid", "evictor-missing",
        "queue-unnamed", "bad-min-resources", "job-missing",
    ],
)
def test_malformed(handler: Any, document: Any, reason: str) -> None:
    with pytest.raises(WireError) as raised:
        handler(document, POLICY)
    assert reason in raised.value.reason
