"""Layer 3 component: what produces usage. ``collectors.agent`` is the node agent (NVML,
PodResources, kubelet stats, pod metadata, spool, publisher); ``collectors.sim`` is the
simulated fleet. The two never import each other.

Imports core, infra and domain packages; never streams, scheduler_hooks, dashboards or app.
"""
