"""Layer 3 component: the kube-scheduler and Volcano extender HTTP service and the quota
actuator (evictions, Volcano queues), with their in-memory caches of quota state and node
topology.

Three parts, as Kueue keeps cache, scheduler and controllers: ``cluster`` (what is known: quota
state, placement, kube objects, the feeds), ``extender`` (what to admit and where: the policy,
the wire formats, the HTTP server) and ``actuator`` (what to do to the cluster). ``cluster``
imports neither of the others, and those two never import each other.

Placement scoring, the policy, the wire formats and the actuator's plan are pure modules.
Imports core, infra and domain packages; never collectors, streams, dashboards or app.
"""
