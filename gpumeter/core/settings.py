"""Settings: one YAML file (``--config`` or GPUMETER_CONFIG), every key also an env var.

A nested key maps to an env var by joining its path with underscores:
``kafka.bootstrap`` is GPUMETER_KAFKA_BOOTSTRAP, ``clickhouse.dsn`` is
GPUMETER_CLICKHOUSE_DSN. Env vars win over the file; the file wins over defaults.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpumeter.core.config_files import ConfigError, read_yaml, validation_failure
from gpumeter.core.topics import topic_name

ENV_PREFIX = "GPUMETER_"
DEFAULTS_DIR = Path(str(resources.files("gpumeter") / "defaults"))


def cache_dir() -> Path:
    """Downloaded artefacts (Kafka jars, kube binaries): ~/.cache/gpumeter or $XDG_CACHE_HOME."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpumeter"


class Partitions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    samples: Annotated[int, Field(ge=1, le=1024)] = 6
    rated: Annotated[int, Field(ge=1, le=1024)] = 6
    other: Annotated[int, Field(ge=1, le=1024)] = 3


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
Compression = Literal["none", "gzip", "lz4", "zstd"]


def _empty_is_none(value: Any) -> Any:
    # settings_env() writes an unset optional as "", and an env var cannot be null otherwise.
    return None if value == "" else value


OptionalPath = Annotated[Path | None, BeforeValidator(_empty_is_none)]
OptionalText = Annotated[str | None, BeforeValidator(_empty_is_none)]


class KafkaSettings(BaseModel):
    """How every client reaches Kafka (contract 9): the agent's publisher, the worker, the
    actuator, the CLI. Secrets come from files only, so they never sit in a command line, an
    env var dump or this model's repr."""

    model_config = ConfigDict(extra="forbid")

    bootstrap: str = "127.0.0.1:9092"
    # Port of the local KRaft controller started by `gpumeter up` (broker port comes from bootstrap).
    controller_port: Annotated[int, Field(ge=1, le=65535)] = 9093
    topic_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]*$")] = ""
    partitions: Partitions = Field(default_factory=Partitions)
    heap: str = "768m"
    replication_factor: Annotated[int, Field(ge=1, le=32)] = 1
    min_insync_replicas: Annotated[int, Field(ge=1, le=32)] = 1
    compression: Compression = "none"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: Annotated[SaslMechanism | None, BeforeValidator(_empty_is_none)] = None
    sasl_username: OptionalText = None
    sasl_password_file: OptionalPath = None
    ssl_cafile: OptionalPath = None
    ssl_certfile: OptionalPath = None
    ssl_keyfile: OptionalPath = None
    # False on managed clusters: topics are verified (partitions, replication, min ISR), never created.
    create_topics: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas ({self.min_insync_replicas}) cannot exceed replication_factor "
                f"({self.replication_factor})")
        missing = self.sasl_mechanism is None or not self.sasl_username or self.sasl_password_file is None
        if self.uses_sasl and missing:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism, "
                             "sasl_username and sasl_password_file")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (a client certificate and its key)")
        return self

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def sasl_password(self) -> str:
        """The SASL password, read from its file at each connection (a rotated Secret is picked up)."""
        if self.sasl_password_file is None:
            raise ConfigError("kafka.sasl_password_file is not set")
        try:
            return self.sasl_password_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"kafka.sasl_password_file {self.sasl_password_file}: {exc.strerror}") from None

    def topic(self, base: str) -> str:
        return topic_name(base, self.topic_prefix)


class ClickHouseSettings(BaseModel):
    """Where ClickHouse is and how gpumeter's tables are laid out on it (contract 9)."""

    model_config = ConfigDict(extra="forbid")

    dsn: str = "http://127.0.0.1:8123/gpumeter"
    # The password, read from a file (a Kubernetes Secret) at each connection; it wins over a
    # password in the DSN, and is never printed.
    password_file: OptionalPath = None
    # A remote_servers cluster name: DDL goes ON CLUSTER to every node.
    cluster: OptionalText = None
    replicated: bool = False  # Replicated* engines ({shard} and {replica} macros)
    sharded: bool = False  # <table>_local on every shard + Distributed <table>

    @model_validator(mode="after")
    def _consistent(self) -> ClickHouseSettings:
        if (self.replicated or self.sharded) and self.cluster is None:
            raise ValueError("replicated and sharded need cluster (DDL reaches every node by ON CLUSTER)")
        if self.cluster is not None and not (self.replicated or self.sharded):
            raise ValueError(f"cluster {self.cluster!r} needs replicated or sharded (plain tables ON CLUSTER "
                             "would hold other rows on every node)")
        return self

    def connection_dsn(self) -> str:
        """The DSN to connect with: ``dsn`` with the password of ``password_file``, if set."""
        if self.password_file is None:
            return self.dsn
        parsed = urlsplit(self.dsn)
        if parsed.scheme not in ("http", "https"):
            return self.dsn
        try:
            password = self.password_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"clickhouse.password_file {self.password_file}: {exc.strerror}") from None
        user = quote(unquote(parsed.username or "default"), safe="")
        host = parsed.netloc.rpartition("@")[2]
        return urlunsplit(parsed._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str = "gpumeter-worker"
    # Rows (and records) per ClickHouse store. Each store costs the server four statements and
    # a part in three tables, whatever its size: with rating native, 5,000-row batches left
    # ClickHouse the busiest process (15,000: 23.5k against 15-17k samples/s; 40,000 slower).
    sink_batch_size: Annotated[int, Field(ge=1, le=100_000)] = 15_000
    sink_batch_seconds: Annotated[float, Field(gt=0, le=60)] = 0.5
    # Upper bound of the sink's exponential back-off while ClickHouse is down.
    sink_max_backoff_seconds: Annotated[float, Field(gt=0, le=300)] = 10.0
    # A worker that stops heartbeating (killed, its node lost) keeps its partitions this long
    # before the group moves them. faust's default, 60 s, held a restarted worker and the
    # samples of its partitions for a minute after a SIGKILL (benchmarks/ledger_recovery.py);
    # heartbeats come from the consumer's own thread every third of this, so a busy agent does
    # not miss them. The broker accepts 6 s to 30 min (group.min/max.session.timeout.ms).
    session_timeout_seconds: Annotated[float, Field(ge=6, le=1800)] = 10.0
    # Prometheus /metrics of the worker; 0 turns it off.
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9465
    # How often the worker looks for new or corrected rate-card files.
    rate_card_reload_seconds: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # Bytes one fetch may bring per partition. Records carry up to 500 samples (~400 KB), so
    # the Kafka client's 1 MiB default held a saturated worker to one fetch round trip per
    # ~2 records a partition (benchmarks: 8 MiB doubled a worker whose store costs nothing).
    fetch_partition_bytes: Annotated[int, Field(ge=1024 * 1024, le=64 * 1024 * 1024)] = 8 * 1024 * 1024
    # Records each agent may hold fetched and not yet processed: bounds the memory bigger
    # fetches could fill (a record is at most Kafka's 1 MiB message).
    stream_buffer_records: Annotated[int, Field(ge=8, le=4096)] = 64


class QuotaSettings(BaseModel):
    """Quota accounting in the worker (contract 4)."""

    model_config = ConfigDict(extra="forbid")

    # A pod that has not reported a gpu window for this long holds no GPUs (max_gpus).
    stale_seconds: Annotated[int, Field(ge=1, le=86400)] = 120
    # How often the tenants file is checked for changes, and quotas re-evaluated without new
    # usage (stale pods, period rollover).
    reload_seconds: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # How often ClickHouse quota_grants is read again (the worker, the actuator, the extender):
    # a grant takes effect within about this long.
    grants_poll_seconds: Annotated[float, Field(gt=0, le=3600)] = 1.0
    # The delays `gpumeter quota status` states a preempt tenant's overshoot bound with
    # (quota/overshoot.py): the agent's sample window (GPUMETER_AGENT_INTERVAL) and the
    # pipeline's p99 from a crossing sample to the eviction request, as measured by
    # benchmarks/quota_latency.py on the operator's own deployment. The default is above the p99
    # benchmarks/quota_overshoot.py measured on a quiet 2-core host (3.3 s; 1 s let 2 of 100
    # crossings past their bound): a stated bound must not be an optimistic one.
    window_seconds: Annotated[int, Field(ge=1, le=3600)] = 15
    pipeline_lag_seconds: Annotated[Decimal, Field(ge=0, le=3600)] = Decimal(5)


SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# A DNS-1123 subdomain, as Kubernetes requires of object names.
KUBE_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KUBE_NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def pod_namespace(namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE) -> str:
    """The namespace this pod runs in (its service account's), else ``default`` (outside a pod)."""
    try:
        found = namespace_file.read_text().strip()
    except OSError:
        return "default"
    return found or "default"


def is_loopback(host: str) -> bool:
    """``host`` is localhost or a loopback address (a name other than localhost may resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


class HooksSettings(BaseModel):
    """`gpumeter hooks`: the scheduler extender HTTP service and the quota actuator (contract 6)."""

    model_config = ConfigDict(extra="forbid")

    listen: Annotated[str, Field(pattern=r"^[^\s:]+:[0-9]{1,5}$")] = "127.0.0.1:8790"
    tls_cert: OptionalPath = None
    tls_key: OptionalPath = None
    # With a client CA a client certificate is required (kube-scheduler's extender tlsConfig).
    # The three files are re-read when they change (a rotated certificate needs no restart).
    client_ca: OptionalPath = None
    # An idle keep-alive connection is closed after this long (above common load balancers' 60 s).
    keepalive_seconds: Annotated[int, Field(ge=1, le=3600)] = 75
    # Plain HTTP on an address other than loopback: the Volcano verbs answer any tenant's quota
    # state to whoever asks, so only by explicit choice, where a NetworkPolicy admits the
    # schedulers alone (the chart's with extender.tls.enabled: false).
    allow_plaintext: bool = False
    group: str = "gpumeter-hooks"
    # Record every decision, act on none (no annotation, no eviction, no queue change).
    dry_run: bool = False
    # Back-off ceiling for an eviction refused by a PodDisruptionBudget (429), retried.
    eviction_max_backoff_seconds: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # The longest the broker holds the actuator's fetch open waiting for quota events. While one
    # fetch is open no other goes to that broker, so a partition left out of it (its previous
    # records not consumed yet when it was sent) waits this long at worst; aiokafka's 500 ms
    # default was a tail of quota enforcement. Smaller costs only idle fetches.
    actuator_fetch_max_wait_ms: Annotated[int, Field(ge=1, le=10_000)] = 50
    # The actuator acts only while it holds this coordination.k8s.io/v1 Lease (contract 9).
    lease_name: Annotated[str, Field(min_length=1, max_length=253, pattern=KUBE_NAME)] = "gpumeter-actuator"
    lease_namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=KUBE_NAMESPACE)] = Field(
        default_factory=pod_namespace)
    # How long a candidate waits, from the last change of the Lease it saw, before taking it over.
    lease_duration_seconds: Annotated[int, Field(ge=2, le=3600)] = 15
    # The leader stops acting when it has not renewed for this long: below the duration, so it
    # has stopped before anyone else can take the Lease.
    renew_deadline_seconds: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # Between attempts to acquire or renew.
    retry_period_seconds: Annotated[float, Field(gt=0, le=600)] = 2.0

    @model_validator(mode="after")
    def _plaintext_only_on_loopback(self) -> HooksSettings:
        host = self.listen.rpartition(":")[0]
        if self.tls_cert is None and not self.allow_plaintext and not is_loopback(host):
            raise ValueError(
                f"hooks.listen {self.listen} without hooks.tls_cert serves every tenant's quota state "
                "in plain HTTP to anyone who can reach it: set hooks.tls_cert, hooks.tls_key and "
                "hooks.client_ca, or hooks.allow_plaintext: true where a NetworkPolicy admits only "
                "the schedulers")
        return self

    @model_validator(mode="after")
    def _lease_timings_ordered(self) -> HooksSettings:
        if not self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                f"hooks.renew_deadline_seconds ({self.renew_deadline_seconds:g}) must be below "
                f"hooks.lease_duration_seconds ({self.lease_duration_seconds}): a leader that cannot renew "
                "must stop acting before another can take the lease")
        if not self.retry_period_seconds < self.renew_deadline_seconds:
            raise ValueError(
                f"hooks.retry_period_seconds ({self.retry_period_seconds:g}) must be below "
                f"hooks.renew_deadline_seconds ({self.renew_deadline_seconds:g}): a renewal must get "
                "more than one try before the deadline")
        return self


class ApiSettings(BaseModel):
    """`gpumeter api`: the tenant invoice API (contract 7)."""

    model_config = ConfigDict(extra="forbid")

    listen: Annotated[str, Field(pattern=r"^[^\s:]+:[0-9]{1,5}$")] = "127.0.0.1:8791"
    # YAML {tokens: [{sha256: <hex>, tenant: T} | {sha256: <hex>, role: finance}]}; digests, never
    # tokens. None: no token is valid, so every request but /healthz is refused.
    tokens: OptionalPath = None
    # HTTPS when both are set; with client_ca a client certificate signed by it is required too
    # (besides the token). The files are re-read when they change (a rotated certificate needs
    # no restart).
    tls_cert: OptionalPath = None
    tls_key: OptionalPath = None
    client_ca: OptionalPath = None
    # Requests per second each token may make (a token bucket of rate_burst requests); callers
    # without a valid token share one bucket per client address. /healthz is never limited.
    rate_limit: Annotated[float, Field(gt=0, le=100_000)] = 20.0
    rate_burst: Annotated[int, Field(ge=1, le=100_000)] = 40
    # An idle keep-alive connection is closed after this long (above common load balancers' 60 s).
    keepalive_seconds: Annotated[int, Field(ge=1, le=3600)] = 75

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("api.tls_cert and api.tls_key must be set together")
        if self.client_ca is not None and self.tls_cert is None:
            raise ValueError("api.client_ca needs api.tls_cert and api.tls_key")
        return self


class InvoiceSettings(BaseModel):
    """What invoices say about who sends them."""

    model_config = ConfigDict(extra="forbid")

    # The seller block of PDF invoices: lines separated by " | " (one env var can hold them).
    seller: str = "gpumeter GPU cluster billing"


class ExplainSettings(BaseModel):
    """`gpumeter explain pod`: where it asks the running extender what it would answer now."""

    model_config = ConfigDict(extra="forbid")

    # The hooks' base URL (``/kube/filter`` is appended); None: ``hooks.listen`` on this host,
    # https when the hooks have a certificate (a wildcard address is asked on 127.0.0.1).
    extender_url: Annotated[Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$")] | None,
                            BeforeValidator(_empty_is_none)] = None
    # TLS: the CA the hooks' certificate is checked against (None: the system's), and the
    # client certificate and key when the hooks require one (hooks.client_ca).
    ca_file: OptionalPath = None
    client_cert: OptionalPath = None
    client_key: OptionalPath = None
    timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 10.0


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Field(default_factory=lambda: cache_dir() / "data")
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    rate_cards: Path = DEFAULTS_DIR / "ratecards"
    tenants: Path | None = DEFAULTS_DIR / "tenants.yaml"
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    quota: QuotaSettings = Field(default_factory=QuotaSettings)
    hooks: HooksSettings = Field(default_factory=HooksSettings)
    explain: ExplainSettings = Field(default_factory=ExplainSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    invoices: InvoiceSettings = Field(default_factory=InvoiceSettings)


def _env_overrides(model: type[BaseModel], env: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """Collect env vars for every leaf field of ``model``, nested as the model is."""
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = f"{prefix}{name.upper()}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            nested = _env_overrides(annotation, env, key + "_")
            if nested:
                found[name] = nested
        elif key in env:
            found[name] = env[key]
    return found


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(config: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Defaults, then the YAML file (``config`` or GPUMETER_CONFIG), then env vars."""
    env = os.environ if env is None else env
    if config is None and env.get(ENV_PREFIX + "CONFIG"):
        config = Path(env[ENV_PREFIX + "CONFIG"])
    document: dict[str, Any] = {}
    if config is not None:
        loaded = read_yaml(config)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{config}: settings must be a YAML mapping")
        document = loaded or {}
    document = _merge(document, _env_overrides(Settings, env, ENV_PREFIX))
    if document.get("tenants") == "":
        document["tenants"] = None
    try:
        return Settings.model_validate(document)
    except ValidationError as exc:
        raise validation_failure(config or Path("<environment>"), exc) from None


def _flatten(model: BaseModel, prefix: str) -> dict[str, str]:
    flat: dict[str, str] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name.upper()}"
        if isinstance(value, BaseModel):
            flat.update(_flatten(value, key + "_"))
        else:
            flat[key] = "" if value is None else str(value)
    return flat


def settings_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment that makes a `gpumeter` subprocess load exactly ``settings``.

    Inherited GPUMETER_* variables are dropped so nothing but ``settings`` decides.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(ENV_PREFIX)}
    env.update(_flatten(settings, ENV_PREFIX))
    return env
