"""Generate the Python stubs of podresources_v1.proto with grpc_tools.protoc.

Run as ``python -m collectors.agent.proto.generate`` (or ``python collectors/agent/proto/generate.py``);
writes ``podresources_v1_pb2.py`` and ``podresources_v1_pb2_grpc.py`` beside the
.proto (or under ``--out``). The stubs import each other as
``collectors.agent.proto.podresources_v1_pb2``, so the .proto is compiled from the
repository root with its package path.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
PROTO = HERE / "podresources_v1.proto"
PACKAGE = "collectors.agent.proto"
STEM = "podresources_v1"
OUTPUTS = (f"{STEM}_pb2.py", f"{STEM}_pb2_grpc.py")

_lock = threading.Lock()


class ProtoGenerationError(RuntimeError):
    """The stubs could not be generated (grpcio-tools missing or protoc failed)."""


def generate(out_dir: Path = HERE) -> list[Path]:
    """Compile the .proto into ``out_dir``; returns the files written."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ProtoGenerationError(
            "grpcio-tools is needed to generate the PodResources stubs: pip install grpcio-tools"
        ) from exc
    include_dir = Path(protoc.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="gpumeter-proto-") as scratch:
        # Lay the .proto out under its package path so generated imports read collectors.agent.proto.X.
        root = Path(scratch)
        tree = root.joinpath(*PACKAGE.split("."))
        tree.mkdir(parents=True)
        shutil.copyfile(PROTO, tree / PROTO.name)
        relative = "/".join([*PACKAGE.split("."), PROTO.name])
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{root}",
                f"-I{include_dir}",
                f"--python_out={root}",
                f"--grpc_python_out={root}",
                relative,
            ]
        )
        if code != 0:
            raise ProtoGenerationError(f"protoc failed on {PROTO} (exit {code})")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in OUTPUTS:
            target = out_dir / name
            # Write beside, then rename: a concurrent importer never sees half a file.
            partial = out_dir / f".{name}.{os.getpid()}.tmp"
            shutil.copyfile(tree / name, partial)
            os.replace(partial, target)
            written.append(target)
        return written


def _fresh(directory: Path) -> bool:
    proto_mtime = PROTO.stat().st_mtime
    return all(
        (directory / name).is_file() and (directory / name).stat().st_mtime >= proto_mtime for name in OUTPUTS
    )


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpumeter" / "proto"


def _load_from(directory: Path) -> tuple[ModuleType, ModuleType]:
    modules = []
    for name in OUTPUTS:
        qualified = f"{PACKAGE}.{name.removesuffix('.py')}"
        if qualified in sys.modules:
            modules.append(sys.modules[qualified])
            continue
        spec = importlib.util.spec_from_file_location(qualified, directory / name)
        if spec is None or spec.loader is None:
            raise ProtoGenerationError(f"cannot load {directory / name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            del sys.modules[qualified]
            raise
        modules.append(module)
    return modules[0], modules[1]


def load() -> tuple[ModuleType, ModuleType]:
    """The (pb2, pb2_grpc) modules, generating them first when missing or stale.

    Generated beside the .proto when that directory is writable, otherwise into
    ``~/.cache/gpumeter/proto`` (e.g. a read-only install in a container image).
    """
    with _lock:
        if not _fresh(HERE):
            try:
                generate(HERE)
            except OSError:
                cache = _cache_dir()
                if not _fresh(cache):
                    generate(cache)
                return _load_from(cache)
        return _load_from(HERE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=HERE, help="output directory (default: beside the .proto)"
    )
    args = parser.parse_args(argv)
    try:
        for path in generate(args.out):
            print(path)
    except ProtoGenerationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
