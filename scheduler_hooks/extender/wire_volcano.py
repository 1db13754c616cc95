"""Volcano extender plugin JSON (pkg/scheduler/plugins/extender), decoded values in and out.

Envelopes (``argument.go``, json-tagged): predicate ``{"task","node"}`` -> ``{"status","code"}``;
prioritize ``{"task","nodes"}`` -> ``{"nodeScore","errorMessage"}``; preemptable and
reclaimable ``{"evictor","evictees"}`` -> ``{"status","victims"}``; queueOverused
``{"queue"}`` -> ``{"overused"}``; jobEnqueueable ``{"job"}`` -> ``{"status"}``; jobReady
``{"job"}`` -> ``{"status"}``. Inside, Volcano's scheduler-cache types have no json tags, so
their keys are Go field names (pkg/scheduler/api): TaskInfo {UID, Job, Name, Namespace,
Resreq, InitResreq, NodeName, Status, Priority, Pod (a v1.Pod, lower-case keys), ...};
Resource {MilliCPU, Memory, ScalarResources {"nvidia.com/gpu": 1000 per GPU}, MaxTaskNum};
NodeInfo {Name, Node (a v1.Node), Idle, Used, Allocatable, ...}; QueueInfo {UID, Name,
Weight, Queue, ...}; JobInfo {UID, Name, Namespace, Queue, MinAvailable, Tasks (map by task
UID), TotalRequest, PodGroup (scheduling.PodGroup flattened: name, namespace, Spec
{MinMember, Queue, MinResources}), ...}. Keys are read case-insensitively, as Go does.

Plugin behaviour this relies on (extender.go): a predicate with an empty ``status`` passes
whatever the code; a message with code 0 is turned into code 1 (Error), so a pass sends
``{"status": "", "code": 0}``. ``nodeScore`` must not be null. Preemptable/reclaimable return
``status`` 0 to abstain, anything else is a vote with ``victims`` intersected by UID.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpumeter.core.kube import GPU_RESOURCE, is_gpu_resource
from scheduler_hooks.cluster.kube_json import (
    MAX_INT64,
    WireError,
    as_int,
    as_list,
    as_number,
    as_object,
    as_str,
    get,
    gpu_count,
)
from scheduler_hooks.extender.policy import PERMIT, PodRequest, Policy, Victim
from scheduler_hooks.extender.wire_kube import pod_request

MILLI_PER_GPU = 1000
SCORE_SCALE = 10  # 0..10 policy scores become 0..100, the range of Volcano's node-order scores


def resource_devices(value: Any, where: str) -> tuple[int, int] | None:
    """(``nvidia.com/gpu``, other GPU devices: MIG devices, renamed time-sliced replicas) in a
    Volcano Resource (milli-units, whole devices rounded up), None when the Resource is null."""
    if value is None:
        return None
    resource = as_object(value, where)
    scalars = as_object(get(resource, "ScalarResources"), f"{where}.ScalarResources", optional=True)
    gpus, other = 0, 0
    for name, amount in scalars.items():
        if not is_gpu_resource(name):
            continue
        field = f"{where}.ScalarResources[{name!r}]"
        milli = as_number(amount, field, default=Decimal(0))
        if milli < 0:
            raise WireError(f"{field} must not be negative")
        if milli > MAX_INT64:  # Volcano's Resource holds float64s, but no node has that many GPUs
            raise WireError(f"{field} is beyond 64 bits: no node has that many GPUs")
        if name == GPU_RESOURCE:
            gpus = math.ceil(milli / MILLI_PER_GPU)
        else:
            other += math.ceil(milli / MILLI_PER_GPU)
    return gpus, other


def task_request(value: Any, where: str = "task") -> PodRequest:
    """A TaskInfo as the policy's PodRequest; GPUs (and other GPU devices) from Resreq, else
    InitResreq, else the Pod."""
    task = as_object(value, where)
    raw_pod = get(task, "Pod")
    pod = pod_request(raw_pod, f"{where}.Pod") if raw_pod is not None else None
    devices = resource_devices(get(task, "Resreq"), f"{where}.Resreq")
    if devices is None:
        devices = resource_devices(get(task, "InitResreq"), f"{where}.InitResreq")
    if devices is None:
        devices = (pod.gpus, pod.other_gpu_devices) if pod is not None else (0, 0)
    gpus, other_gpu_devices = devices
    namespace = as_str(get(task, "Namespace"), f"{where}.Namespace", default="")
    name = as_str(get(task, "Name"), f"{where}.Name", default="")
    uid = as_str(get(task, "UID"), f"{where}.UID", default="")
    default_priority = pod.priority if pod is not None else 0
    return PodRequest(
        namespace=namespace or (pod.namespace if pod is not None else "default"),
        name=name or (pod.name if pod is not None else ""),
        uid=uid or (pod.uid if pod is not None else ""),
        gpus=gpus,
        priority=as_int(get(task, "Priority"), f"{where}.Priority", default=default_priority),
        annotations=pod.annotations if pod is not None else {},
        other_gpu_devices=other_gpu_devices,
    )


def node_name(value: Any, where: str = "node") -> str:
    node = as_object(value, where)
    name = as_str(get(node, "Name"), f"{where}.Name", default="")
    if not name:
        v1_node = as_object(get(node, "Node"), f"{where}.Node", optional=True)
        meta = as_object(get(v1_node, "metadata"), f"{where}.Node.metadata", optional=True)
        name = as_str(get(meta, "name"), f"{where}.Node.metadata.name", default="")
    if not name:
        raise WireError(f"{where} has no Name")
    return name


def queue_name(value: Any, where: str = "queue") -> str:
    queue = as_object(value, where)
    name = as_str(get(queue, "Name"), f"{where}.Name", default="")
    if not name:
        source = as_object(get(queue, "Queue"), f"{where}.Queue", optional=True)
        name = as_str(get(source, "name"), f"{where}.Queue.name", default="")
    if not name:
        raise WireError(f"{where} has no Name")
    return name


def job_request(value: Any, where: str = "job") -> tuple[str, int]:
    """(namespace, GPU devices) of a JobInfo: the largest of its total request, its tasks'
    requests and its PodGroup's MinResources (tasks may not exist yet when a job asks to
    enqueue). Devices are whole GPUs plus MIG devices and renamed replicas: any of them makes
    it a GPU job, which a blocked tenant is refused."""
    job = as_object(value, where)
    group = as_object(get(job, "PodGroup"), f"{where}.PodGroup", optional=True)
    namespace = as_str(get(job, "Namespace"), f"{where}.Namespace", default="")
    namespace = namespace or as_str(get(group, "namespace"), f"{where}.PodGroup.namespace", default="")
    total = sum(resource_devices(get(job, "TotalRequest"), f"{where}.TotalRequest") or (0, 0))
    tasks = as_object(get(job, "Tasks"), f"{where}.Tasks", optional=True)
    from_tasks = 0
    for uid, task in tasks.items():
        request = task_request(task, f"{where}.Tasks[{uid!r}]")
        from_tasks += request.gpus + request.other_gpu_devices
    spec = as_object(get(group, "Spec"), f"{where}.PodGroup.Spec", optional=True)
    minimum = as_object(get(spec, "MinResources"), f"{where}.PodGroup.Spec.MinResources", optional=True)
    from_group = sum(gpu_count(amount, f"{where}.PodGroup.Spec.MinResources[{name!r}]")
                     for name, amount in minimum.items() if is_gpu_resource(name))
    return namespace or "default", max(total, from_tasks, from_group)


def _envelope(document: Any, verb: str) -> dict[str, Any]:
    return as_object(document, f"{verb} request")


def _required(envelope: dict[str, Any], key: str, verb: str) -> Any:
    value = get(envelope, key)
    if value is None:
        raise WireError(f"{verb} request needs {key!r}")
    return value


# Each verb: ``parse_*`` checks the document (pure, reads no state: the server may run it off
# the event loop), ``decide_*`` answers from the policy (on the loop); ``handle_*`` is both.


def parse_predicate(document: Any) -> tuple[PodRequest, str]:
    request = _envelope(document, "predicate")
    task = task_request(_required(request, "task", "predicate"))
    return task, node_name(_required(request, "node", "predicate"))


def decide_predicate(args: tuple[PodRequest, str], policy: Policy) -> dict[str, Any]:
    code, message = policy.predicate(*args)
    return {"status": message, "code": code}


def parse_prioritize(document: Any) -> tuple[PodRequest, list[str]]:
    request = _envelope(document, "prioritize")
    task = task_request(_required(request, "task", "prioritize"))
    nodes = as_list(get(request, "nodes"), "nodes", optional=True)
    return task, [node_name(node, f"nodes[{i}]") for i, node in enumerate(nodes)]


def decide_prioritize(args: tuple[PodRequest, list[str]], policy: Policy) -> dict[str, Any]:
    task, names = args
    return {"nodeScore": policy.node_scores(task, names, SCORE_SCALE), "errorMessage": ""}


@dataclass(frozen=True)
class Evictions:
    evictor: PodRequest
    victims: list[Victim]
    by_uid: dict[str, Any]  # each evictee's JSON as sent, echoed back when chosen


def _parse_evictions(document: Any, verb: str) -> Evictions:
    request = _envelope(document, verb)
    evictor = task_request(_required(request, "evictor", verb), "evictor")
    raw = as_list(get(request, "evictees"), "evictees", optional=True)
    by_uid: dict[str, Any] = {}
    victims: list[Victim] = []
    for i, item in enumerate(raw):
        evictee = task_request(item, f"evictees[{i}]")
        if not evictee.uid:
            raise WireError(f"evictees[{i}].UID is missing")
        by_uid[evictee.uid] = item
        victims.append(Victim(evictee.uid, evictee))
    return Evictions(evictor, victims, by_uid)


def parse_preemptable(document: Any) -> Evictions:
    return _parse_evictions(document, "preemptable")


def parse_reclaimable(document: Any) -> Evictions:
    return _parse_evictions(document, "reclaimable")


def decide_evictions(args: Evictions, policy: Policy) -> dict[str, Any]:
    chosen = policy.volcano_victims(args.evictor, args.victims)
    return {"status": PERMIT, "victims": [args.by_uid[victim.uid] for victim in chosen]}


def parse_queue_overused(document: Any) -> str:
    request = _envelope(document, "queueOverused")
    return queue_name(_required(request, "queue", "queueOverused"))


def decide_queue_overused(queue: str, policy: Policy) -> dict[str, Any]:
    return {"overused": policy.queue_overused(queue)}


def parse_job_enqueueable(document: Any) -> tuple[str, int]:
    request = _envelope(document, "jobEnqueueable")
    return job_request(_required(request, "job", "jobEnqueueable"))


def decide_job_enqueueable(args: tuple[str, int], policy: Policy) -> dict[str, Any]:
    return {"status": policy.job_enqueueable(*args)}


def parse_job_ready(document: Any) -> None:
    request = _envelope(document, "jobReady")
    job_request(_required(request, "job", "jobReady"))


def decide_job_ready(args: None, policy: Policy) -> dict[str, Any]:
    """No opinion on gang readiness: always true (quota is enforced by predicate and enqueue)."""
    return {"status": True}


def handle_predicate(document: Any, policy: Policy) -> dict[str, Any]:
    return decide_predicate(parse_predicate(document), policy)


def handle_prioritize(document: Any, policy: Policy) -> dict[str, Any]:
    return decide_prioritize(parse_prioritize(document), policy)


def handle_preemptable(document: Any, policy: Policy) -> dict[str, Any]:
    return decide_evictions(parse_preemptable(document), policy)


def handle_reclaimable(document: Any, policy: Policy) -> dict[str, Any]:
    return decide_evictions(parse_reclaimable(document), policy)


def handle_queue_overused(document: Any, policy: Policy) -> dict[str, Any]:
    return decide_queue_overused(parse_queue_overused(document), policy)


def handle_job_enqueueable(document: Any, policy: Policy) -> dict[str, Any]:
    return decide_job_enqueueable(parse_job_enqueueable(document), policy)


def handle_job_ready(document: Any, policy: Policy) -> dict[str, Any]:
    parse_job_ready(document)
    return decide_job_ready(None, policy)
