"""Handing the open bus's JetStream data to the app account: moves once, never merges."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.natsauth.migration import adopt_global_account
from shared.errors import ConfigError


def make(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "streams").mkdir()
    return path


def test_the_global_accounts_data_moves_to_the_app_account(tmp_path: Path):
    make(tmp_path / "jetstream" / "$G")
    assert adopt_global_account(tmp_path, account="DRA")
    assert (tmp_path / "jetstream" / "DRA" / "streams").is_dir()
    assert not (tmp_path / "jetstream" / "$G").exists()
    assert not adopt_global_account(tmp_path, account="DRA")  # idempotent


def test_an_empty_app_account_directory_is_replaced(tmp_path: Path):
    make(tmp_path / "jetstream" / "$G")
    (tmp_path / "jetstream" / "DRA").mkdir()
    assert adopt_global_account(tmp_path, account="DRA")


def test_two_accounts_with_data_are_left_to_the_operator(tmp_path: Path):
    make(tmp_path / "jetstream" / "$G")
    make(tmp_path / "jetstream" / "DRA")
    with pytest.raises(ConfigError, match="both"):
        adopt_global_account(tmp_path, account="DRA")
    assert (tmp_path / "jetstream" / "$G").is_dir()
