"""Layer 2 domain: rating arithmetic (contract 3), invoices, adjustments, exports (JSON/CSV),
the invoice store and its table.

Rating and invoice arithmetic are pure (values in, values out; no Kafka, ClickHouse, faust or
kubernetes). Imports core and infra only; never quota, insights or any component.
"""
