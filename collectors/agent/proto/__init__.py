"""The kubelet PodResources v1 protocol: the .proto and its generated stubs.

The ``*_pb2*.py`` stubs are generated but committed: ``generate.py`` writes them,
and :func:`load` writes them again on first use when they are missing or older
than the .proto.
"""
