"""The kubelet PodResources v1 protocol: the .proto and its generated stubs.

The ``*_pb2*.py`` stubs are build products (gitignored): ``generate.py`` writes
them, and :func:`load` writes them on first use when they are missing or older
than the .proto.
"""
