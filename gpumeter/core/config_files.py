"""Loading YAML config files (rate cards, tenants, settings) with one clear error per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpumeter.core.models import describe_validation_error


class ConfigError(ValueError):
    """A config file that cannot be used, with the file and the reason in the message."""


class _DecimalSafeLoader(yaml.SafeLoader):
    """YAML loader that never yields float: unquoted 0.35 becomes the string '0.35'.

    Our models turn those strings into Decimal; a float would already be inexact.
    """


def _float_as_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


_DecimalSafeLoader.add_constructor("tag:yaml.org,2002:float", _float_as_text)


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.load(text, Loader=_DecimalSafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def validation_failure(path: Path, exc: ValidationError) -> ConfigError:
    return ConfigError(f"{path}: {describe_validation_error(exc)}")
