"""The quota actuator: what to do to the cluster when a tenant crosses its quota (evictions,
spot reclaim, Volcano queues) and the records of it. Reads ``scheduler_hooks.cluster``; never
imports the extender."""
