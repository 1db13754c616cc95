"""Shared test doubles and builders: named stand-ins for NVML and the kubelet PodResources server,
cluster-state builders, and contract document builders. Tests and benchmarks import them;
the product never does.

The stand-ins behave like the real libraries where the product relies on them, errors
included (NVML NOT_SUPPORTED, gRPC status codes)."""
