"""Layer 3 component: the kube-scheduler and Volcano extender HTTP service and the quota
actuator (evictions, Volcano queues), with their in-memory caches of quota state and node
topology.

Placement scoring and the wire formats are pure modules. Imports core, infra and domain
packages; never collectors, streams, dashboards or app.
"""
