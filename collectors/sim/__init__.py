"""The simulated fleet: seeded, deterministic GPU nodes, pods and their usage samples, and the
runner that publishes them. Must not import ``collectors.agent``."""
