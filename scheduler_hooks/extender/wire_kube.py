"""kube-scheduler HTTP extender JSON (k8s.io/kube-scheduler/extender/v1), decoded values in and out.

The Go types have no json tags, so the wire keys are the Go field names; Go's decoder matches
keys case-insensitively, so input keys are accepted in any case, and output always uses the
Go names with ``null`` where a field is unset (no omitempty upstream). Shapes verified against
``staging/src/k8s.io/kube-scheduler/extender/v1/types.go``:

- ExtenderArgs {Pod *v1.Pod, Nodes *v1.NodeList, NodeNames *[]string}
- ExtenderFilterResult {Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}
- HostPriorityList [{Host, Score}] (Score 0..MaxExtenderPriority = 10)
- ExtenderPreemptionArgs {Pod, NodeNameToVictims map[string]*Victims{Pods []*v1.Pod,
  NumPDBViolations}, NodeNameToMetaVictims map[string]*MetaVictims{Pods []*MetaPod{UID},
  NumPDBViolations}}; ExtenderPreemptionResult {NodeNameToMetaVictims}

Each verb is a ``parse_*`` (the document to checked arguments: pure, reads no state, so the
server may run it off the event loop for a large body) and a ``decide_*`` (the policy's answer:
reads the state, on the loop); ``handle_*`` is the two in one.

The NodeNames request kube-scheduler sends with ``nodeCacheCapable: true`` is also read from
its raw body (``read_extender_args``, the native extension): the names stay undecoded, the
fit table's native mirror answers filter and prioritize in one pass each, and only the Pod is
decoded in Python. Anything that is not plainly that request, or a pod no fit table alone
answers, takes the path above; the answers are the same bytes.

Both ``nodeCacheCapable`` modes: with ``NodeNames`` the answer carries ``NodeNames`` (``Nodes``
null); with the full ``Nodes`` list it carries ``Nodes`` with the passing items (``NodeNames``
null). Malformed shapes raise ``WireError``; the HTTP layer answers 400 with its reason.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from scheduler_hooks.cluster.json_pieces import REQUESTED_PIECES, json_value
from scheduler_hooks.cluster.kube_json import (
    WireError,
    as_int,
    as_list,
    as_object,
    as_str,
    get,
    pod_gpu_requests,
    string_map,
)
from scheduler_hooks.cluster.placement import FitTable
from scheduler_hooks.extender.policy import FilterResult, PodRequest, Policy

try:
    from gpumeter_native import NodeNames, priorities, read_node_names
except ImportError:  # not built (`make install` builds it): every body is decoded in Python
    read_node_names = None  # type: ignore[assignment]

# -- v1.Pod -> PodRequest --------------------------------------------------------------------

def pod_request(value: Any, where: str = "Pod") -> PodRequest:
    """The policy's view of a v1.Pod: namespace, name, uid, GPUs (and other GPU devices),
    priority, annotations."""
    pod = as_object(value, where)
    meta = as_object(get(pod, "metadata"), f"{where}.metadata", optional=True)
    spec = as_object(get(pod, "spec"), f"{where}.spec", optional=True)
    gpus, other_gpu_devices = pod_gpu_requests(spec, f"{where}.spec")
    return PodRequest(
        namespace=as_str(get(meta, "namespace"), f"{where}.metadata.namespace", default="default")
        or "default",
        name=as_str(get(meta, "name"), f"{where}.metadata.name", default=""),
        uid=as_str(get(meta, "uid"), f"{where}.metadata.uid", default=""),
        gpus=gpus,
        priority=as_int(get(spec, "priority"), f"{where}.spec.priority", default=0),
        annotations=string_map(get(meta, "annotations"), f"{where}.metadata.annotations"),
        other_gpu_devices=other_gpu_devices,
    )


# -- filter / prioritize ---------------------------------------------------------------------


@dataclass(frozen=True)
class ExtenderArgs:
    pod: PodRequest
    node_names: list[str]  # every candidate, in order
    sent_names: list[str] | None  # NodeNames as sent (nodeCacheCapable: true), else None
    sent_nodes: dict[str, Any] | None  # Nodes (a v1.NodeList) as sent, else None
    items: list[tuple[str, Any]] = field(default_factory=list)  # (name, v1.Node) of sent_nodes


def _node_name(node: Any, where: str) -> str:
    meta = as_object(get(as_object(node, where), "metadata"), f"{where}.metadata", optional=True)
    name = as_str(get(meta, "name"), f"{where}.metadata.name")
    if not name:
        raise WireError(f"{where}.metadata.name must not be empty")
    return name


def parse_extender_args(document: Any) -> ExtenderArgs:
    args = as_object(document, "ExtenderArgs")
    raw_pod = get(args, "Pod")
    if raw_pod is None:
        raise WireError("ExtenderArgs.Pod is missing")
    pod = pod_request(raw_pod)
    raw_names, raw_nodes = get(args, "NodeNames"), get(args, "Nodes")
    sent_names: list[str] | None = None
    if raw_names is not None:
        sent_names = as_list(raw_names, "NodeNames")
        try:
            # Every item a string, checked in C (a quarter of any per-item check over 5,000 names).
            "".join(sent_names)
        except TypeError:
            for i, name in enumerate(sent_names):
                as_str(name, f"NodeNames[{i}]")
    sent_nodes: dict[str, Any] | None = None
    items: list[tuple[str, Any]] = []
    if raw_nodes is not None:
        sent_nodes = as_object(raw_nodes, "Nodes")
        for i, node in enumerate(as_list(get(sent_nodes, "items"), "Nodes.items", optional=True)):
            items.append((_node_name(node, f"Nodes.items[{i}]"), node))
    if sent_names is not None and not items:
        names = sent_names
    else:
        names = list(dict.fromkeys([*(sent_names or []), *(name for name, _ in items)]))
    return ExtenderArgs(pod, names, sent_names, sent_nodes, items)


@dataclass(frozen=True)
class NamesArgs:
    """A NodeNames request read from its raw body (``read_extender_args``): the pod decoded,
    the names not (``names.decode()`` gives them as ``parse_extender_args`` would)."""

    pod: PodRequest
    names: NodeNames

    def expanded(self) -> ExtenderArgs:
        """The ExtenderArgs ``parse_extender_args`` gives for the same body."""
        names = self.names.decode()
        return ExtenderArgs(self.pod, names, names, None)


# A Pod is a few KB; one larger than this is left to the Python path with the whole body, which
# the server decodes on a worker thread when the body is large (a Pod of thousands of
# containers costs seconds of checking, which must not run on the loop).
MAX_READ_POD_BYTES = 64 * 1024


def read_extender_args(body: bytes) -> NamesArgs | None:
    """The request of ``body`` when it is plainly a NodeNames one (an object of ``Pod``,
    ``NodeNames`` strings and ``Nodes`` null, each key once, exactly so spelled) and its Pod
    (at most MAX_READ_POD_BYTES) decodes; else None, and the caller decodes ``body``
    (``parse_extender_args``), which decides and words any refusal. None without the native
    extension."""
    if read_node_names is None:
        return None
    read = read_node_names(body)
    if read is None:
        return None
    raw_pod, names = read
    if len(raw_pod) > MAX_READ_POD_BYTES:
        return None
    try:
        pod = pod_request(orjson.loads(raw_pod))
    except (orjson.JSONDecodeError, WireError):
        return None
    return NamesArgs(pod, names)


def filter_result(args: ExtenderArgs, result: FilterResult) -> dict[str, Any]:
    """ExtenderFilterResult in the mode(s) the request used; ``Error`` empty.

    ``result`` is ``policy.filter(args.pod, args.node_names, distinct=False)``: with NodeNames
    alone its passed list is the answer's NodeNames, a name sent twice listed twice.
    """
    nodes: dict[str, Any] | None = None
    names: list[str] | None = None
    if args.sent_nodes is None and args.sent_names is not None:
        # NodeNames alone: node_names is that list as sent, so the policy's passed list (input
        # order, repeats kept: handle_filter asks for them) is the answer itself.
        names = result.passed
    else:
        passed = set(result.passed)
        if args.sent_nodes is not None:
            nodes = {k: v for k, v in args.sent_nodes.items() if k.casefold() not in ("metadata", "items")}
            nodes["metadata"] = get(args.sent_nodes, "metadata") or {}
            nodes["items"] = [node for name, node in args.items if name in passed]
        if args.sent_names is not None:
            names = [n for n in args.sent_names if n in passed]
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(result.failed),
        "FailedAndUnresolvableNodes": dict(result.unresolvable),
        "Error": "",
    }


def filter_error(message: str) -> dict[str, Any]:
    """An ExtenderFilterResult carrying only ``Error`` (the scheduler treats it as a failure)."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": None, "FailedAndUnresolvableNodes": None,
            "Error": message}


def prioritize_result(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"Host": name, "Score": score} for name, score in scores]


def encode_host_priorities(names: list[str], scores: list[int]) -> bytes:
    """The HostPriorityList JSON of ``prioritize_result(list(zip(names, scores)))``, byte for
    byte as orjson writes it, from pieces encoded once per (node, score): one C-level join,
    no dict per node. ``names`` must be strings, ``scores`` ints (what the policy returns)."""
    pieces = map(operator.getitem, map(REQUESTED_PIECES.__getitem__, scores), names)
    return b"[" + b",".join(pieces) + b"]"


def filter_answer(document: Any, policy: Policy) -> dict[str, Any]:
    """The ExtenderFilterResult for a request, as a JSON value (the plain answer: decide_filter's
    fast path must agree with it, byte for byte when encoded)."""
    args = parse_extender_args(document)
    # node_names repeats a name only when NodeNames alone did: filter_result wants them kept.
    return filter_result(args, policy.filter(args.pod, args.node_names, distinct=False))


def handle_filter(document: Any, policy: Policy) -> bytes:
    """``filter_answer`` JSON-encoded, as the server sends it (parse, then decide)."""
    return decide_filter(parse_extender_args(document), policy)


def decide_filter(args: ExtenderArgs | NamesArgs, policy: Policy) -> bytes:
    """The encoded ExtenderFilterResult of parsed ``args`` (on the event loop: reads the state).

    A request read from its raw body is answered by the fit table's native mirror where the
    table alone answers it (``filter_table``), in one pass over the undecoded names; otherwise
    its names are decoded and it goes the way below.

    The hot path (``NodeNames`` alone, a GPU pod its tenant's quota lets through) joins the
    fit table's pieces instead: ``NodeNames`` is one C-level pass over the names, and
    ``FailedNodes`` the ready ``"<node>":"<reason>"`` members of the nodes that fail, with no
    dict built or encoded per request. The answer parses to ``filter_answer``'s; its bytes are
    the same too, except that a known node's name orjson refuses (a lone surrogate) is written
    escaped inside an otherwise orjson-written answer, as the prioritize pieces are.
    """
    if isinstance(args, NamesArgs):
        fits = policy.filter_table(args.pod)
        if fits is not None and fits.native is not None:
            return fits.native.filter(args.names)
        args = args.expanded()
    table = policy.filter_table(args.pod) if args.sent_nodes is None and args.sent_names is not None else None
    if table is not None:
        encoded = encode_filter_names(args.node_names, table)
        if encoded is not None:
            return encoded
    return json_value(filter_result(args, policy.filter(args.pod, args.node_names, distinct=False)))


def encode_filter_names(names: list[str], table: FitTable) -> bytes | None:
    """The NodeNames-mode ExtenderFilterResult of ``names`` (as sent: a repeated name that passes
    is listed as often) against one fit table; None when orjson refuses a passing name (the
    caller encodes the plain answer, wholly escaped, as before)."""
    # One lookup per name, the only pass that hashes the request's strings: its FailedNodes
    # member, or None where the node passes (fits, or is unknown to the table, as in
    # Policy.filter). The passes after it only walk lists and the table's own objects.
    members = list(map(table.failed.get, names))
    if not any(members):  # stops at the first failure; members are non-empty bytes or None
        passed, failed = names, b""
    else:
        passed = list(itertools.compress(names, map(operator.not_, members)))
        # dict.fromkeys: a failing name sent twice is one member, as in a dict.
        failed = b",".join(dict.fromkeys(filter(None, members)))
    try:
        listed = orjson.dumps(passed)
    except TypeError:
        return None
    return (b'{"Nodes":null,"NodeNames":' + listed + b',"FailedNodes":{' + failed
            + b'},"FailedAndUnresolvableNodes":{},"Error":""}')


def handle_prioritize(document: Any, policy: Policy) -> list[dict[str, Any]]:
    args = parse_extender_args(document)
    return prioritize_result(policy.prioritize(args.pod, args.node_names))


def handle_prioritize_encoded(document: Any, policy: Policy) -> bytes:
    return decide_prioritize_encoded(parse_extender_args(document), policy)


def decide_prioritize_encoded(args: ExtenderArgs | NamesArgs, policy: Policy) -> bytes:
    """``handle_prioritize`` already JSON-encoded: the server's path, the same bytes joined from
    the fit table's host pieces (one C-level lookup per name, no dict per node); for a request
    read from its raw body, joined natively from the table's mirror."""
    table = policy.fit_table(args.pod)
    if isinstance(args, NamesArgs):
        if table is None:
            return priorities(args.names, 0)
        if table.native is not None:
            return table.native.prioritize(args.names)
        args = args.expanded()
    names = list(dict.fromkeys(args.node_names))
    if table is None:  # no GPUs asked, or refused: 0 everywhere
        return encode_host_priorities(names, [0] * len(names))
    return b"[" + b",".join(map(table.hosts.__getitem__, names)) + b"]"


# -- preempt ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreemptionArgs:
    pod: PodRequest
    victims: dict[str, list[str]]  # node -> victim UIDs, in the order sent
    pdb_violations: dict[str, int]
    observed: dict[str, PodRequest]  # uid -> the victim pod, when sent in full (NodeNameToVictims)


def parse_preemption_args(document: Any) -> PreemptionArgs:
    args = as_object(document, "ExtenderPreemptionArgs")
    raw_pod = get(args, "Pod")
    if raw_pod is None:
        raise WireError("ExtenderPreemptionArgs.Pod is missing")
    pod = pod_request(raw_pod)
    victims: dict[str, list[str]] = {}
    violations: dict[str, int] = {}
    observed: dict[str, PodRequest] = {}
    meta = as_object(get(args, "NodeNameToMetaVictims"), "NodeNameToMetaVictims", optional=True)
    for node, entry in meta.items():
        where = f"NodeNameToMetaVictims[{node!r}]"
        body = as_object(entry, where, optional=True)
        pods = as_list(get(body, "Pods"), f"{where}.Pods", optional=True)
        victims[node] = [
            as_str(get(as_object(p, f"{where}.Pods[{i}]"), "UID"), f"{where}.Pods[{i}].UID")
            for i, p in enumerate(pods)
        ]
        violations[node] = as_int(get(body, "NumPDBViolations"), f"{where}.NumPDBViolations", default=0)
    full = as_object(get(args, "NodeNameToVictims"), "NodeNameToVictims", optional=True)
    for node, entry in full.items():
        if node in victims:
            continue
        where = f"NodeNameToVictims[{node!r}]"
        body = as_object(entry, where, optional=True)
        uids = []
        for i, raw in enumerate(as_list(get(body, "Pods"), f"{where}.Pods", optional=True)):
            victim = pod_request(raw, f"{where}.Pods[{i}]")
            if not victim.uid:
                raise WireError(f"{where}.Pods[{i}].metadata.uid is missing")
            observed[victim.uid] = victim
            uids.append(victim.uid)
        victims[node] = uids
        violations[node] = as_int(get(body, "NumPDBViolations"), f"{where}.NumPDBViolations", default=0)
    return PreemptionArgs(pod, victims, violations, observed)


def preemption_result(args: PreemptionArgs, kept: Mapping[str, list[str]]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always the meta form, whichever form the request used."""
    return {
        "NodeNameToMetaVictims": {
            node: {
                "Pods": [{"UID": uid} for uid in uids],
                "NumPDBViolations": args.pdb_violations.get(node, 0),
            }
            for node, uids in kept.items()
            if uids
        }
    }


def decide_preempt(args: PreemptionArgs, policy: Policy) -> dict[str, Any]:
    return preemption_result(args, policy.preempt(args.pod, args.victims, args.observed))


def handle_preempt(document: Any, policy: Policy) -> dict[str, Any]:
    return decide_preempt(parse_preemption_args(document), policy)
