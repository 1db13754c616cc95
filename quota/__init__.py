"""Quota rules (contract 4): usage against a tenant's policy, and whom to evict.

``accounting`` keeps a per-tenant ledger and turns usage into one quota event per
crossing; ``victims`` orders a tenant's pods for preemption and spot reclaim;
``periods`` names quota periods. Pure: values in, values out, ``now`` always a
parameter. Must not import Kafka, ClickHouse, faust, kubernetes or any component
package (streams, scheduler_hooks, collectors, dashboards).
"""
