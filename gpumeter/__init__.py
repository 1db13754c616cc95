"""gpumeter: GPU metering, real-time quotas and exact billing for shared Kubernetes GPU clusters.

Layers, bottom to top (DESIGN.md "Layout"; `make lint` enforces them with import-linter):
``gpumeter.core`` -> ``gpumeter.infra`` -> domain (``pricing``, ``quota``, ``insights``) ->
components (``collectors``, ``streams``, ``scheduler_hooks``, ``dashboards``) -> ``gpumeter.app``.
A module imports only from layers below its own; packages of one layer never import each other.
"""
