"""Layer 3 component: the faust app. Rating stage, ClickHouse sink, dead letters, quota accounting
in the stream.

Imports core, infra and domain packages; never collectors, scheduler_hooks, dashboards or app.
"""
