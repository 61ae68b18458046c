"""Passwords out of everything printed or recorded: a storage URL such as
`postgresql://user:secret@host/db` is shown as `postgresql://user:***@host/db`."""

from __future__ import annotations

import re

# `user:password@` in text that is not one parseable URL: an error message, a command line, a
# URL missing its `://`.
_CREDENTIALS = re.compile(r"(?P<head>[^\s:/@]+:)[^\s/@]*@")


def hide_password(url: str) -> str:
    """`url` as SQLAlchemy renders it with `hide_password=True` (its password as ***); text
    that SQLAlchemy cannot parse has any `user:password@` in it masked the same way."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return hide_passwords(url)
    # Rendered only to hide a password: rendering escapes characters ("sqlite:///:memory:"
    # would read "sqlite:///%3Amemory%3A"), so a URL without one is shown as given.
    return url if parsed.password is None else parsed.render_as_string(hide_password=True)


def hide_passwords(text: str) -> str:
    """`text` with the password of every `user:password@` in it replaced by ***."""
    return _CREDENTIALS.sub(r"\g<head>***@", text)
