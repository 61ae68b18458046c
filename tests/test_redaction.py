"""Passwords masked in URLs and in free text (error messages, recorded command lines)."""

from __future__ import annotations

import pytest

from pipeline.redaction import hide_password, hide_passwords


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://me:pw@db:5432/studies", "postgresql://me:***@db:5432/studies"),
        ("mysql+pymysql://me:p%40ss@db/studies", "mysql+pymysql://me:***@db/studies"),
        ("postgresql//me:pw@db/studies", "postgresql//me:***@db/studies"),  # not parseable
        ("postgresql://me@db/studies", "postgresql://me@db/studies"),
        ("sqlite:////tmp/a b/study.db", "sqlite:////tmp/a b/study.db"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),  # shown as given: no password
    ],
)
def test_a_url_is_shown_without_its_password(url, shown):
    assert hide_password(url) == shown


def test_every_url_in_a_text_loses_its_password():
    text = "--storage postgresql://me:pw@db/x and mysql://you:pa:ss@h/y; error: a@b"
    assert hide_passwords(text) == (
        "--storage postgresql://me:***@db/x and mysql://you:***@h/y; error: a@b"
    )
