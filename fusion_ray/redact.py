"""Credentials never leave the process: the one place that blanks them out of text.

Every URI or message that fusion_ray or analysis prints, logs, tags or writes into a report goes
through ``redact`` first: the password of a URI's user info (``http://user:PASSWORD@host``),
query-string values whose names look secret (``?secret_key=...``, ``token=``, ``password=``,
``signature=`` ...), and the values of environment variables whose names look secret
(``MLFLOW_TRACKING_PASSWORD``, ``AWS_SECRET_ACCESS_KEY``, ``*_TOKEN`` ...) wherever they appear.
Standard library only, so both packages import it (like the schema).

``split_credentials`` is its other half: an ``http(s)://user:password@host`` URI as the URI
without them plus the user and password, so a process can hand the credentials to a client
through the environment and keep (and show, log or pickle) only the URI without them.
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"
_SECRET_NAME = re.compile(
    r"(pass(word|wd)?|secret|token|key|credential|signature|sig|auth)", re.IGNORECASE
)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"<>]+")  # a quote may be in a password
_MIN_SECRET = 6
"""Environment values shorter than this are not masked (they would blank ordinary words)."""


def _secret_values() -> list[str]:
    values = [
        v
        for k, v in os.environ.items()
        if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET and not k.startswith("PS")
    ]
    return sorted(set(values), key=len, reverse=True)


def redact_uri(uri: str) -> str:
    """``uri`` with its password and secret-looking query values replaced by ``***``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{user}@{host}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True) if query else []
    if any(_SECRET_NAME.search(k) for k, _ in pairs):
        masked = [(k, MASK if _SECRET_NAME.search(k) else v) for k, v in pairs]
        query = urlencode(masked, safe="*${}")
    if (netloc, query) == (parts.netloc, parts.query):
        return uri  # nothing secret: unchanged, so sqlite:/// and file:/// keep their slashes
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact(text: object) -> str:
    """``text`` (any object, as str) with every URI's credentials and every secret-looking
    environment value replaced by ``***``."""
    out = _URI.sub(lambda m: redact_uri(m.group(0)), str(text))
    for value in _secret_values():
        out = out.replace(value, MASK)
    return out


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """An ``http(s)`` URI with ``user:password@`` in it as (the URI without them, the user, the
    password), both percent-decoded as an HTTP client sends them; any other URI (no password,
    another scheme: a database URI needs its password in the URI) as (``uri``, None, None)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri, None, None
    if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
        return uri, None, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    if ":" not in userinfo:
        return uri, None, None
    user, password = userinfo.split(":", 1)
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, unquote(user), unquote(password)
