"""What the hooks know of the cluster: quota state, node topology and placement, pods, nodes and
namespaces, and the feeds that keep that knowledge current. Imports neither the extender nor
the actuator (both read it)."""
