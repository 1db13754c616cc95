"""Layer 0, the kernel: contract models (pydantic v2), rate cards, tenants, money, validation,
Decimal-only JSON, topic names, record framing and settings.

Owns the contracts of DESIGN.md. Imports nothing of gpumeter but itself: no Kafka, ClickHouse,
faust or kubernetes clients, and no domain, component or app package.
"""
