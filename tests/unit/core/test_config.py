"""Rate cards (contract 2), tenants file (contract 4) and settings (env + YAML)."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpumeter.core.config_files import ConfigError, read_yaml
from gpumeter.core.ratecard import Rate, RateCard, RateCardSet, load_rate_card, load_rate_cards
from gpumeter.core.settings import load_settings
from gpumeter.core.tenants import TenantPolicy, load_tenants
from testkit.builders import rate_card

CONTRACT_CARD = """\
version: "2026-11"
currency: USD
effective_from: "2026-11-01T00:00:00Z"
capacity_multipliers: {on-demand: "1", reserved: "0.6", spot: "0.35"}
rates:
  - {kind: gpu, gpu_model: H100-SXM-80GB, unit_price: "2.50",
     tiers: [{up_to: 1000, unit_price: "2.50"}, {up_to: 10000, unit_price: "2.25"},
             {up_to: null, unit_price: "2.00"}]}
  - {kind: gpu, gpu_model: A100-SXM-40GB, mig_profile: 1g.5gb, unit_price: "0.40"}
  - {kind: gpu, unit_price: "1.80"}          # fallback for any other GPU model
  - {kind: cpu, unit_price: "0.04"}          # per core-hour
  - {kind: memory, unit_price: "0.005"}      # per GiB-hour
  - {kind: storage, unit_price: "0.0002"}    # per GiB-hour
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def card_error(card: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        RateCard.model_validate(card)
    return str(caught.value)


# --- rate cards ----------------------------------------------------------------------------------


def test_contract_example_card_loads_exactly(tmp_path):
    card = load_rate_card(write(tmp_path / "card.yaml", CONTRACT_CARD))
    assert card.version == "2026-11"
    assert card.effective_from == datetime(2026, 11, 1, tzinfo=UTC)
    assert card.capacity_multipliers == {
        "on-demand": Decimal(1),
        "reserved": Decimal("0.6"),
        "spot": Decimal("0.35"),
    }
    h100 = card.rates[0]
    assert h100.tiers is not None
    assert [(t.up_to, t.unit_price) for t in h100.tiers] == [
        (Decimal(1000), Decimal("2.50")),
        (Decimal(10000), Decimal("2.25")),
        (None, Decimal("2.00")),
    ]
    assert h100.list_price == Decimal("2.50")
    assert card.rates[1].selector == ("gpu", "A100-SXM-40GB", "1g.5gb")
    assert card.rates[5].list_price == Decimal("0.0002")


def test_unquoted_yaml_floats_are_read_exactly(tmp_path):
    text = """\
        version: "v1"
        currency: USD
        effective_from: 2026-11-01T00:00:00Z
        capacity_multipliers: {on-demand: 1, reserved: 0.6, spot: 0.35}
        rates:
          - {kind: cpu, unit_price: 0.1}
          - {kind: memory, unit_price: 0.005}
          - {kind: gpu, unit_price: 1.80,
             tiers: [{up_to: 1000.5, unit_price: 1.80}, {up_to: null, unit_price: 1.7}]}
        """
    card = load_rate_card(write(tmp_path / "card.yaml", text))
    spot = card.capacity_multipliers["spot"]
    assert spot == Decimal("0.35")
    assert spot != Decimal(0.35)  # noqa: RUF032 -- the binary float 0.35 is 0.34999999999999997779...
    assert card.rates[0].unit_price == Decimal("0.1")
    assert card.rates[1].unit_price == Decimal("0.005")
    tiers = card.rates[2].tiers
    assert tiers is not None
    assert tiers[0].up_to == Decimal("1000.5")
    assert tiers[1].unit_price == Decimal("1.7")
    # an unquoted YAML timestamp with Z is an aware instant too
    assert card.effective_from == datetime(2026, 11, 1, tzinfo=UTC)


def test_read_yaml_never_yields_float(tmp_path):
    document = read_yaml(write(tmp_path / "x.yaml", "a: 0.35\nb: [1.5, 2e-3, .5]\nc: 3\n"))
    assert document == {"a": "0.35", "b": ["1.5", "2e-3", ".5"], "c": 3}


def test_tiers_without_unit_price_use_first_band_as_list_price():
    rate = Rate.model_validate(
        {"kind": "gpu", "tiers": [{"up_to": 10, "unit_price": "3"}, {"up_to": None, "unit_price": "2"}]}
    )
    assert rate.list_price == Decimal(3)


def test_unit_price_equal_to_first_tier_in_another_spelling_is_fine():
    rate = Rate.model_validate(
        {
            "kind": "gpu",
            "unit_price": "2.5",
            "tiers": [{"up_to": 10, "unit_price": "2.50"}, {"up_to": None, "unit_price": "2"}],
        }
    )
    assert rate.list_price == Decimal("2.50")


@pytest.mark.parametrize(
    ("rate", "words"),
    [
        pytest.param(
            {"kind": "gpu", "tiers": [{"up_to": 1000, "unit_price": "2"}, {"up_to": 500, "unit_price": "1"},
                                      {"up_to": None, "unit_price": "1"}]},
            "ascend",
            id="tiers-not-ascending",
        ),
        pytest.param(
            {"kind": "gpu", "tiers": [{"up_to": 1000, "unit_price": "2"}, {"up_to": 1000, "unit_price": "1"},
                                      {"up_to": None, "unit_price": "1"}]},
            "ascend",
            id="tiers-repeat-an-edge",
        ),
        pytest.param(
            {"kind": "gpu", "tiers": [{"up_to": None, "unit_price": "2"}, {"up_to": 10, "unit_price": "1"}]},
            "null",
            id="open-tier-not-last",
        ),
        pytest.param(
            {"kind": "gpu", "tiers": [{"up_to": 10, "unit_price": "2"}, {"up_to": 20, "unit_price": "1"}]},
            "null",
            id="no-open-last-tier",
        ),
        pytest.param({"kind": "gpu", "tiers": []}, "empty", id="no-tiers"),
        pytest.param(
            {"kind": "gpu", "unit_price": "2.40",
             "tiers": [{"up_to": 1000, "unit_price": "2.50"}, {"up_to": None, "unit_price": "2"}]},
            "first tier",
            id="unit-price-not-first-tier",
        ),
        pytest.param(
            {"kind": "gpu", "mig_profile": "1g.5gb", "unit_price": "1"}, "gpu_model",
            id="mig-profile-without-model",
        ),
        pytest.param(
            {"kind": "cpu", "gpu_model": "H100-SXM-80GB", "unit_price": "1"}, "gpu_model",
            id="cpu-with-gpu-model",
        ),
        pytest.param({"kind": "gpu"}, "unit_price", id="no-price"),
        pytest.param({"kind": "gpu", "unit_price": "-1"}, "unit_price", id="negative-price"),
        pytest.param({"kind": "gpu", "unit_price": "abc"}, "unit_price", id="price-not-a-number"),
        pytest.param({"kind": "gpu", "unit_price": 1.5}, "float", id="price-as-float"),
        pytest.param({"kind": "tpu", "unit_price": "1"}, "kind", id="unknown-kind"),
        pytest.param({"kind": "gpu", "unit_price": "1", "discount": "0.1"}, "discount", id="unknown-field"),
        pytest.param(
            {
                "kind": "gpu",
                "tiers": [{"up_to": 10, "unit_price": "1", "x": 1}, {"up_to": None, "unit_price": "1"}],
            },
            "x",
            id="unknown-tier-field",
        ),
    ],
)
def test_invalid_rates_rejected(rate, words):
    message = card_error(rate_card(rates=[rate]))
    assert words in message, message


@pytest.mark.parametrize(
    ("multipliers", "words"),
    [
        pytest.param({"on-demand": "1", "reserved": "0.6"}, "spot", id="missing-spot"),
        pytest.param({"on-demand": "1", "spot": "0.35"}, "reserved", id="missing-reserved"),
        pytest.param(
            {"on-demand": "1", "reserved": "0.6", "spot": "0.35", "preemptible": "0.2"}, "preemptible",
            id="extra-preemptible",
        ),
        pytest.param({"on-demand": "1", "reserved": "0.6", "spot": "-0.35"}, "spot", id="negative-spot"),
    ],
)
def test_capacity_multipliers_must_name_exactly_the_three_types(multipliers, words):
    assert words in card_error(rate_card(capacity_multipliers=multipliers))


@pytest.mark.parametrize(
    "rates",
    [
        pytest.param(
            [{"kind": "cpu", "unit_price": "1"}, {"kind": "cpu", "unit_price": "2"}],
            id="same-kind",
        ),
        pytest.param(
            [
                {"kind": "gpu", "gpu_model": "H100", "unit_price": "1"},
                {"kind": "gpu", "gpu_model": "H100", "unit_price": "1"},
            ],
            id="same-model",
        ),
        pytest.param(
            [
                {"kind": "gpu", "gpu_model": "A100", "mig_profile": "1g.5gb", "unit_price": "1"},
                {"kind": "gpu", "gpu_model": "A100", "mig_profile": "1g.5gb", "unit_price": "2"},
            ],
            id="same-model-and-profile",
        ),
    ],
)
def test_duplicate_selector_rejected(rates):
    assert "duplicate" in card_error(rate_card(rates=rates))


def test_same_model_different_profiles_are_distinct_selectors():
    card = RateCard.model_validate(
        rate_card(
            rates=[
                {"kind": "gpu", "gpu_model": "A100", "unit_price": "1"},
                {"kind": "gpu", "gpu_model": "A100", "mig_profile": "1g.5gb", "unit_price": "0.4"},
                {"kind": "gpu", "gpu_model": "A100", "mig_profile": "2g.10gb", "unit_price": "0.6"},
            ]
        )
    )
    assert len(card.rates) == 3


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        pytest.param({"currency": "usd"}, "currency", id="currency-lower-case"),
        pytest.param({"currency": "US"}, "currency", id="currency-two-letters"),
        pytest.param({"effective_from": "2026-11-01T00:00:00"}, "effective_from", id="effective_from-naive"),
        pytest.param({"effective_from": "November"}, "effective_from", id="effective_from-words"),
        pytest.param({"version": ""}, "version", id="version-empty"),
        pytest.param({"notes": "x"}, "notes", id="unknown-field"),
    ],
)
def test_invalid_card_fields(changes, words):
    assert words in card_error(rate_card(**changes))


def test_card_missing_multipliers_in_yaml_names_the_file(tmp_path):
    path = write(
        tmp_path / "bad.yaml",
        """\
        version: "v1"
        currency: USD
        effective_from: "2026-11-01T00:00:00Z"
        capacity_multipliers: {on-demand: "1", reserved: "0.6"}
        rates: [{kind: cpu, unit_price: "0.04"}]
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_rate_cards(path)
    assert str(path) in str(caught.value)
    assert "spot" in str(caught.value)


def _card_yaml(version: str, effective_from: str, cpu: str) -> str:
    return (
        f'version: "{version}"\ncurrency: USD\neffective_from: "{effective_from}"\n'
        'capacity_multipliers: {on-demand: "1", reserved: "0.6", spot: "0.35"}\n'
        f'rates: [{{kind: cpu, unit_price: "{cpu}"}}]\n'
    )


def test_directory_of_cards_sorted_by_effective_from(tmp_path):
    # File names sort the other way round from effective_from on purpose.
    write(tmp_path / "a-later.yml", _card_yaml("2026-11", "2026-11-01T00:00:00Z", "0.04"))
    write(tmp_path / "b-earlier.yaml", _card_yaml("2026-10", "2026-10-01T00:00:00Z", "0.045"))
    write(tmp_path / "README.txt", "not a card")
    cards = load_rate_cards(tmp_path)
    assert [card.version for card in cards.cards] == ["2026-10", "2026-11"]
    boundary = datetime(2026, 11, 1, tzinfo=UTC)
    card_at = cards.card_at
    assert card_at(boundary - timedelta(microseconds=1)).version == "2026-10"  # type: ignore[union-attr]
    assert card_at(boundary).version == "2026-11"  # type: ignore[union-attr]
    assert card_at(datetime(2027, 6, 1, tzinfo=UTC)).version == "2026-11"  # type: ignore[union-attr]
    assert card_at(datetime(2026, 9, 30, tzinfo=UTC)) is None
    assert cards.by_version("2026-10").rates[0].list_price == Decimal("0.045")


def test_single_file_is_a_set_of_one(tmp_path):
    cards = load_rate_cards(write(tmp_path / "one.yaml", CONTRACT_CARD))
    assert [card.version for card in cards.cards] == ["2026-11"]


def test_two_cards_with_one_effective_from_rejected(tmp_path):
    # The same instant written in two offsets.
    write(tmp_path / "a.yaml", _card_yaml("a", "2026-11-01T00:00:00Z", "0.04"))
    write(tmp_path / "b.yaml", _card_yaml("b", "2026-11-01T08:00:00+08:00", "0.05"))
    with pytest.raises(ConfigError) as caught:
        load_rate_cards(tmp_path)
    assert "effective_from" in str(caught.value)


def test_two_cards_with_one_version_rejected(tmp_path):
    write(tmp_path / "a.yaml", _card_yaml("same", "2026-10-01T00:00:00Z", "0.04"))
    write(tmp_path / "b.yaml", _card_yaml("same", "2026-11-01T00:00:00Z", "0.05"))
    with pytest.raises(ConfigError) as caught:
        load_rate_cards(tmp_path)
    assert "version" in str(caught.value)


def test_empty_set_rejected():
    with pytest.raises(ValidationError):
        RateCardSet(cards=[])


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        pytest.param("empty-dir", "no rate card", id="empty-directory"),
        pytest.param("missing", "not found", id="missing-path"),
        pytest.param("bad-yaml", "YAML", id="bad-yaml"),
        pytest.param("list", "mapping", id="list-not-mapping"),
    ],
)
def test_rate_card_loading_errors(tmp_path, setup, words):
    target = tmp_path / "cards"
    if setup == "empty-dir":
        target.mkdir()
    elif setup == "bad-yaml":
        target = write(tmp_path / "bad.yaml", "version: [unclosed\n")
    elif setup == "list":
        target = write(tmp_path / "list.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError) as caught:
        load_rate_cards(target)
    assert words in str(caught.value)


def test_shipped_default_cards_load():
    folder = Path(__file__).resolve().parents[3] / "gpumeter" / "defaults" / "ratecards"
    cards = load_rate_cards(folder)
    assert [card.version for card in cards.cards] == ["2026-10", "2026-11"]


def test_cards_in_the_set_are_sorted_even_when_given_unsorted():
    later = RateCard.model_validate(rate_card(version="later", effective_from="2026-12-01T00:00:00Z"))
    earlier = RateCard.model_validate(
        rate_card(version="earlier", effective_from="2026-10-01T00:00:00-05:00")
    )
    cards = RateCardSet(cards=[later, earlier])
    assert [card.version for card in cards.cards] == ["earlier", "later"]
    with pytest.raises(KeyError):
        cards.by_version("nope")


# --- tenants file --------------------------------------------------------------------------------

CONTRACT_TENANTS = """\
tenants:
  - tenant: team-a
    period: month              # quota period: month | day
    gpu_hours: 5000            # Σ gpu unit_hours in the period; null = none
    spend: "20000.00"          # Σ list cost in the period; null = none
    max_gpus: 64               # GPUs held at once; null = none
    warn_at: [0.8, 0.9]
    on_exceed: preempt         # preempt | block | notify
    grace_seconds: 30
    commitment: "1000.00"      # minimum monthly spend; optional
    credits: "250.00"          # applied to the month's invoice; optional
  - tenant: minimal
"""


def test_contract_tenants_example(tmp_path):
    tenants = load_tenants(write(tmp_path / "tenants.yaml", CONTRACT_TENANTS))
    team = tenants.policy("team-a")
    assert team is not None
    assert team.gpu_hours == Decimal(5000)
    assert team.spend == Decimal("20000.00")
    assert team.max_gpus == Decimal(64)
    assert team.warn_at == [Decimal("0.8"), Decimal("0.9")]  # exact, read as text
    assert team.on_exceed == "preempt"
    assert team.commitment == Decimal("1000.00")
    assert team.credits == Decimal("250.00")
    minimal = tenants.policy("minimal")
    assert minimal is not None
    assert (minimal.gpu_hours, minimal.spend, minimal.max_gpus, minimal.commitment, minimal.credits) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert minimal.period == "month"
    assert tenants.policy("stranger") is None


def test_no_tenants_file_and_empty_file(tmp_path):
    assert load_tenants(None).tenants == []
    assert load_tenants(write(tmp_path / "empty.yaml", "")).tenants == []
    assert load_tenants(write(tmp_path / "none.yaml", "tenants: []\n")).policy("x") is None


def test_duplicate_tenants_rejected(tmp_path):
    path = write(tmp_path / "t.yaml", "tenants:\n  - tenant: dup\n  - tenant: other\n  - tenant: dup\n")
    with pytest.raises(ConfigError) as caught:
        load_tenants(path)
    assert "dup" in str(caught.value)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    "warn_at",
    [[0], [1], [1.5], [-0.1], [0.9, 0.8], [0.8, 0.8], ["abc"]],
    ids=["zero", "one", "above-one", "negative", "descending", "repeated", "not-a-number"],
)
def test_warn_at_bounds_rejected(tmp_path, warn_at):
    path = write(tmp_path / "t.yaml", f"tenants:\n  - tenant: a\n    warn_at: {warn_at}\n")
    with pytest.raises(ConfigError) as caught:
        load_tenants(path)
    assert "warn_at" in str(caught.value)


@pytest.mark.parametrize(
    "warn_at",
    [[], [0.5], [0.000001, 0.999999], [0.5, 0.75, 0.9]],
    ids=["none", "one-half", "near-the-bounds", "three-ascending"],
)
def test_warn_at_accepted(warn_at):
    policy = TenantPolicy.model_validate({"tenant": "a", "warn_at": [str(f) for f in warn_at]})
    assert policy.warn_at == [Decimal(str(f)) for f in warn_at]


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        pytest.param({"tenant": "a", "budget": 5}, "budget", id="unknown-field-budget"),
        pytest.param({"tenant": "a", "period": "week"}, "period", id="period-week"),
        pytest.param({"tenant": "a", "on_exceed": "kill"}, "on_exceed", id="on_exceed-kill"),
        pytest.param({"tenant": "Team A"}, "tenant", id="tenant-with-space"),
        pytest.param({"tenant": "a", "commitment": "-1"}, "commitment", id="commitment-negative"),
        pytest.param({"tenant": "a", "credits": "lots"}, "credits", id="credits-not-a-number"),
        pytest.param({"tenant": "a", "gpu_hours": "-5"}, "gpu_hours", id="gpu_hours-negative"),
        pytest.param({"tenant": "a", "grace_seconds": -1}, "grace_seconds", id="grace-negative"),
        pytest.param({"tenant": "a", "grace_seconds": 86401}, "grace_seconds", id="grace-over-a-day"),
        pytest.param({"period": "month"}, "tenant", id="tenant-missing"),
    ],
)
def test_invalid_tenant_entries(tmp_path, entry, field):
    path = write(tmp_path / "t.yaml", yaml.safe_dump({"tenants": [entry]}))
    with pytest.raises(ConfigError) as caught:
        load_tenants(path)
    assert field in str(caught.value)


def test_unknown_top_level_key_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError):
        load_tenants(write(tmp_path / "a.yaml", "tenants: []\nextra: 1\n"))
    with pytest.raises(ConfigError):
        load_tenants(write(tmp_path / "b.yaml", "- tenant: a\n"))


def test_shipped_default_tenants_load():
    tenants = load_tenants(Path(__file__).resolve().parents[3] / "gpumeter" / "defaults" / "tenants.yaml")
    assert tenants.policy("team-a") is not None


# --- settings --------------------------------------------------------------------------------------


def test_defaults_without_file_or_env():
    settings = load_settings(env={})
    assert settings.kafka.bootstrap == "127.0.0.1:9092"
    assert settings.clickhouse.dsn == "http://127.0.0.1:8123/gpumeter"
    assert settings.kafka.partitions.samples == 6
    assert settings.rate_cards.exists()
    assert settings.tenants is not None and settings.tenants.exists()


def test_env_overrides():
    settings = load_settings(
        env={
            "GPUMETER_KAFKA_BOOTSTRAP": "kafka-1:9092,kafka-2:9092",
            "GPUMETER_CLICKHOUSE_DSN": "http://ch:8123/billing",
            "GPUMETER_KAFKA_PARTITIONS_SAMPLES": "12",
            "UNRELATED": "x",
        }
    )
    assert settings.kafka.bootstrap == "kafka-1:9092,kafka-2:9092"
    assert settings.clickhouse.dsn == "http://ch:8123/billing"
    assert settings.kafka.partitions.samples == 12
    assert settings.kafka.partitions.rated == 6  # untouched sibling keeps its default


@pytest.mark.parametrize(
    "value", ["0", "abc", "1025", ""], ids=["zero", "not-a-number", "above-1024", "empty"]
)
def test_bad_env_value_is_a_config_error(value):
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"GPUMETER_KAFKA_PARTITIONS_SAMPLES": value})
    assert "samples" in str(caught.value)


def test_env_wins_over_file_and_file_over_defaults(tmp_path):
    config = write(
        tmp_path / "gpumeter.yaml",
        """\
        kafka:
          bootstrap: from-file:9092
          partitions: {rated: 9}
        clickhouse:
          dsn: http://file:8123/db
        rate_cards: /srv/cards
        """,
    )
    settings = load_settings(config, env={"GPUMETER_KAFKA_BOOTSTRAP": "from-env:9092"})
    assert settings.kafka.bootstrap == "from-env:9092"  # env wins
    assert settings.kafka.partitions.rated == 9  # file wins over default
    assert settings.kafka.partitions.samples == 6  # default
    assert settings.clickhouse.dsn == "http://file:8123/db"
    assert settings.rate_cards == Path("/srv/cards")
    settings = load_settings(
        config, env={"GPUMETER_CLICKHOUSE_DSN": "http://env:8123/db", "GPUMETER_KAFKA_PARTITIONS_RATED": "3"}
    )
    assert settings.clickhouse.dsn == "http://env:8123/db"
    assert settings.kafka.partitions.rated == 3
    assert settings.kafka.bootstrap == "from-file:9092"


def test_config_file_from_env_and_explicit_argument_wins(tmp_path):
    from_env = write(tmp_path / "env.yaml", "kafka: {bootstrap: env-file:1}\n")
    explicit = write(tmp_path / "explicit.yaml", "kafka: {bootstrap: explicit-file:1}\n")
    assert load_settings(env={"GPUMETER_CONFIG": str(from_env)}).kafka.bootstrap == "env-file:1"
    settings = load_settings(explicit, env={"GPUMETER_CONFIG": str(from_env)})
    assert settings.kafka.bootstrap == "explicit-file:1"


def test_empty_tenants_env_means_no_tenants_file(tmp_path):
    assert load_settings(env={"GPUMETER_TENANTS": ""}).tenants is None
    assert load_settings(env={"GPUMETER_TENANTS": str(tmp_path / "t.yaml")}).tenants == tmp_path / "t.yaml"
    assert load_settings(env={"GPUMETER_RATE_CARDS": "/x/cards"}).rate_cards == Path("/x/cards")
    assert load_settings(env={"GPUMETER_DATA_DIR": "/x/data"}).data_dir == Path("/x/data")


def test_process_environment_is_used_by_default(monkeypatch):
    monkeypatch.setenv("GPUMETER_KAFKA_BOOTSTRAP", "process-env:9092")
    monkeypatch.delenv("GPUMETER_CONFIG", raising=False)
    assert load_settings().kafka.bootstrap == "process-env:9092"
    assert load_settings(env={}).kafka.bootstrap == "127.0.0.1:9092"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("kafka: {bootstrapp: x}\n", "bootstrapp", id="unknown-kafka-key"),
        pytest.param("surprise: 1\n", "surprise", id="unknown-top-level-key"),
        pytest.param("- a\n", "mapping", id="not-a-mapping"),
        pytest.param("kafka: [\n", "YAML", id="broken-yaml"),
    ],
)
def test_bad_settings_file(tmp_path, text, words):
    path = write(tmp_path / "s.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert words in str(caught.value)
    assert str(path) in str(caught.value)


def test_empty_settings_file_is_defaults(tmp_path):
    settings = load_settings(write(tmp_path / "s.yaml", ""), env={})
    assert settings.kafka.bootstrap == "127.0.0.1:9092"


def test_missing_settings_file(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path / "nope.yaml", env={})
    assert "not found" in str(caught.value)


# --- clickhouse cluster settings (contract 9) ---------------------------------------------------


def test_clickhouse_cluster_settings_come_from_env():
    settings = load_settings(env={"GPUMETER_CLICKHOUSE_CLUSTER": "main",
                                  "GPUMETER_CLICKHOUSE_REPLICATED": "true",
                                  "GPUMETER_CLICKHOUSE_SHARDED": "true"})
    assert (settings.clickhouse.cluster, settings.clickhouse.replicated, settings.clickhouse.sharded) == (
        "main", True, True)
    assert load_settings(env={}).clickhouse.cluster is None


@pytest.mark.parametrize(("env", "says"), [
    pytest.param({"GPUMETER_CLICKHOUSE_REPLICATED": "true"}, "need cluster", id="replicated-without-cluster"),
    pytest.param({"GPUMETER_CLICKHOUSE_SHARDED": "true"}, "need cluster", id="sharded-without-cluster"),
    pytest.param({"GPUMETER_CLICKHOUSE_CLUSTER": "main"}, "needs replicated or sharded", id="cluster-alone"),
])
def test_a_clickhouse_topology_that_cannot_be_laid_out_is_a_config_error(env, says):
    with pytest.raises(ConfigError, match=says) as caught:
        load_settings(env=env)
    assert "clickhouse" in str(caught.value)


def test_the_clickhouse_password_comes_from_its_file_and_wins_over_the_dsn(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cr:t@\n")
    settings = load_settings(env={"GPUMETER_CLICKHOUSE_DSN": "https://billing:old@ch.example:8443/gm",
                                  "GPUMETER_CLICKHOUSE_PASSWORD_FILE": str(secret)})
    assert settings.clickhouse.connection_dsn() == "https://billing:s3cr%3At%40@ch.example:8443/gm"
    assert "s3cr" not in repr(settings)


def test_a_missing_clickhouse_password_file_is_one_line_naming_the_setting(tmp_path):
    settings = load_settings(env={"GPUMETER_CLICKHOUSE_PASSWORD_FILE": str(tmp_path / "absent")})
    with pytest.raises(ConfigError, match=r"^clickhouse.password_file .*absent: No such file"):
        settings.clickhouse.connection_dsn()


def test_lease_settings_default_and_from_env(tmp_path):
    settings = load_settings(env={})
    assert (settings.hooks.lease_name, settings.hooks.lease_duration_seconds) == ("gpumeter-actuator", 15)
    assert (settings.hooks.renew_deadline_seconds, settings.hooks.retry_period_seconds) == (10.0, 2.0)
    tuned = load_settings(env={"GPUMETER_HOOKS_LEASE_NAME": "actuator-blue",
                               "GPUMETER_HOOKS_LEASE_NAMESPACE": "ops",
                               "GPUMETER_HOOKS_LEASE_DURATION_SECONDS": "8",
                               "GPUMETER_HOOKS_RENEW_DEADLINE_SECONDS": "5",
                               "GPUMETER_HOOKS_RETRY_PERIOD_SECONDS": "1"})
    assert (tuned.hooks.lease_name, tuned.hooks.lease_namespace) == ("actuator-blue", "ops")
    assert (tuned.hooks.lease_duration_seconds, tuned.hooks.renew_deadline_seconds) == (8, 5.0)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("gpumeter-system\n", "gpumeter-system", id="service-account-file"),
        pytest.param("", "default", id="empty-file"),
        pytest.param(None, "default", id="outside-a-pod"),
    ],
)
def test_lease_namespace_is_the_pods_own(tmp_path, content, expected):
    from gpumeter.core.settings import pod_namespace

    path = tmp_path / "namespace"
    if content is not None:
        path.write_text(content)
    assert pod_namespace(path) == expected


@pytest.mark.parametrize(
    ("env", "words"),
    [
        pytest.param({"GPUMETER_HOOKS_RENEW_DEADLINE_SECONDS": "15"}, "renew_deadline_seconds",
                     id="deadline-equals-duration"),
        pytest.param({"GPUMETER_HOOKS_LEASE_DURATION_SECONDS": "5"}, "renew_deadline_seconds",
                     id="duration-below-deadline"),
        pytest.param({"GPUMETER_HOOKS_RETRY_PERIOD_SECONDS": "10"}, "retry_period_seconds",
                     id="retry-equals-deadline"),
        pytest.param({"GPUMETER_HOOKS_LEASE_NAME": "Not_A_Name"}, "lease_name", id="bad-lease-name"),
    ],
)
def test_lease_settings_out_of_order_are_refused(env, words):
    with pytest.raises(ConfigError) as caught:
        load_settings(env=env)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        pytest.param({}, False, id="default-loopback"),
        pytest.param({"GPUMETER_HOOKS_LISTEN": "localhost:8790"}, False, id="localhost"),
        pytest.param({"GPUMETER_HOOKS_LISTEN": "127.0.0.2:8790"}, False, id="loopback-net"),
        pytest.param({"GPUMETER_HOOKS_LISTEN": "0.0.0.0:8790"}, True, id="all-addresses-plaintext"),
        pytest.param({"GPUMETER_HOOKS_LISTEN": "hooks.example:8790"}, True, id="a-name-plaintext"),
        pytest.param({"GPUMETER_HOOKS_LISTEN": "0.0.0.0:8790", "GPUMETER_HOOKS_ALLOW_PLAINTEXT": "true"},
                     False, id="plaintext-by-explicit-choice"),
        pytest.param({"GPUMETER_HOOKS_LISTEN": "0.0.0.0:8790", "GPUMETER_HOOKS_TLS_CERT": "/tls/tls.crt",
                      "GPUMETER_HOOKS_TLS_KEY": "/tls/tls.key"}, False, id="tls"),
    ],
)
def test_hooks_serve_plain_http_beyond_loopback_only_by_explicit_choice(env, refused):
    """Issue 31, point 7: in plaintext mode any pod could read every tenant's quota state."""
    if refused:
        with pytest.raises(ConfigError) as caught:
            load_settings(env=env)
        assert "hooks.allow_plaintext" in str(caught.value) and "hooks.tls_cert" in str(caught.value)
    else:
        assert load_settings(env=env).hooks.listen == env.get("GPUMETER_HOOKS_LISTEN", "127.0.0.1:8790")
