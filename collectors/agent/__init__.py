"""The node agent: NVML readings, kubelet PodResources (which devices a pod got), kubelet stats,
pod metadata, samples on aligned windows, a crash-safe spool and the Kafka publisher.

Must not import ``collectors.sim``: the agent never sees simulated data."""
