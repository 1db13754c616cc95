"""Rate cards picked up while the worker runs: new and corrected files, bad files refused."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from gpumeter.core import jsonio
from gpumeter.core.config_files import ConfigError
from streams.ratecards import RateCardWatcher
from streams.stage import RatingStage
from testkit.builders import rate_card, sample


def write(directory: Path, name: str, card: dict[str, object]) -> None:
    (directory / name).write_text(yaml.safe_dump(card), encoding="utf-8")


def test_a_new_card_is_loaded_and_an_unchanged_directory_is_not_reloaded(tmp_path: Path) -> None:
    write(tmp_path, "v1.yaml", rate_card())
    watcher = RateCardWatcher(tmp_path)
    assert watcher.poll() is None
    write(tmp_path, "v2.yaml", rate_card(version="v2", effective_from="2026-11-15T00:00:00Z"))
    loaded = watcher.poll()
    assert loaded is not None and [card.version for card in loaded.cards] == ["v1", "v2"]
    assert watcher.poll() is None


def test_a_bad_file_is_refused_once_and_the_last_good_set_stays(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, "v1.yaml", rate_card())
    watcher = RateCardWatcher(tmp_path)
    (tmp_path / "v2.yaml").write_text("version: v2\nrates: [{kind: tpu}]\n", encoding="utf-8")
    assert watcher.poll() is None
    assert watcher.poll() is None  # the same bad content: not reported again
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "v2.yaml" in refusals[0].getMessage()
    assert [card.version for card in watcher.current.cards] == ["v1"]
    write(tmp_path, "v2.yaml", rate_card(version="v2", effective_from="2026-11-15T00:00:00Z"))
    assert watcher.poll() is not None


def test_a_bad_set_at_start_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "v1.yaml").write_text("not: [a, card\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        RateCardWatcher(tmp_path)


def test_a_corrected_card_with_the_same_version_prices_the_next_samples(tmp_path: Path) -> None:
    """The rater caches rates per card version: a correction must not be hidden by that cache."""
    write(tmp_path, "v1.yaml", rate_card())
    watcher = RateCardWatcher(tmp_path)
    stage = RatingStage(watcher.current, "samples")
    before = stage.process(jsonio.dumpb(sample("a", gpu_model="X-GPU")), 0, 0).rated
    write(tmp_path, "v1.yaml", rate_card(rates=[{"kind": "gpu", "unit_price": "2.10"}]))
    cards = watcher.poll()
    assert cards is not None
    stage.use_cards(cards)
    after = stage.process(jsonio.dumpb(sample("b", gpu_model="X-GPU")), 0, 1).rated
    assert before is not None and after is not None
    assert (before.unit_price, after.unit_price) == (Decimal("1.80"), Decimal("2.10"))
