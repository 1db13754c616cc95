"""Layer 4, the composition root: the CLI (one module per command), the demo, the local runtime
(Kafka broker, ClickHouse server, process launchers), and the wiring of settings into
components.

The only layer that may import every other; nothing imports it.
"""
