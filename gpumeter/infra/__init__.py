"""Layer 1, adapters: the Kafka client and topic admin, the ClickHouse client, DSNs, the
declarative table type (DDL and row codec from one declaration), the pipeline tables and
forward-only migrations.

Imports only ``gpumeter.core`` and client libraries; never a domain, component or app package.
"""
