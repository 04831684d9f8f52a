"""Credentials never leave the process: the one place that blanks them out of text.

Every URI or message that fusion_ray or analysis prints, logs, tags or writes into a report goes
through ``redact`` first: the password of a URI's user info (``http://user:PASSWORD@host``),
query-string values whose names look secret (``?secret_key=...``, ``token=``, ``password=``,
``signature=`` ...), and the values of environment variables whose names look secret
(``MLFLOW_TRACKING_PASSWORD``, ``AWS_SECRET_ACCESS_KEY``, ``*_TOKEN`` ...) wherever they appear.
A password is masked up to the last ``@`` before the host, so one holding ``#``, ``?``, ``/`` or
``@`` unencoded (which a URI parser ends the user info at) is masked whole; every password this
process read in a URI is masked wherever it reappears (a short one between ``:`` and ``@``). Standard library only,
so both packages import it (like the schema).

``split_credentials`` is its other half: an ``http(s)://user:password@host`` URI as the URI
without them plus the user and password, so a process can hand the credentials to a client
through the environment and keep (and show, log or pickle) only the URI without them.
``credentials_problem`` says when a URI's user info cannot be read as written (a reserved
character that must be percent-encoded), so that it is refused before anything uses it.
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"
_SECRET_NAME = re.compile(
    r"(pass(word|wd)?|secret|token|key|credential|signature|sig|auth)", re.IGNORECASE
)
_SCHEME = r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://"
"""A URI's scheme, where a run of scheme characters starts (so a long text is read once)."""
_URI = re.compile(rf"{_SCHEME}[^\s\"<>]+")  # a quote may be in a password
_MIN_SECRET = 6
"""Environment values shorter than this are not masked (they would blank ordinary words)."""

_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]*)(?::\d*)?"
"""A URI's host (a name, an IPv4 or a bracketed IPv6 address) and optional port."""
_END = r"(?=[/?#:\s\"'<>),;\]]|$)"
"""What may follow a URI's host: its path, query or fragment, or the text around the URI."""
_USERINFO = re.compile(
    rf"(?P<head>{_SCHEME}[^\s:/?#@\"<>]*):(?P<password>\S*)@(?P<host>{_HOST}){_END}"
)
"""``scheme://user:password@host`` in running text: the password runs to the last ``@`` that a
host follows before the next white space, so reserved characters in it are masked too."""
_WHOLE_USERINFO = re.compile(
    rf"(?P<head>{_SCHEME}[^\s:/?#@\"<>]*):(?P<password>.*)@(?P<host>{_HOST}){_END}",
    re.DOTALL,
)
"""The same in one whole URI, where the password may hold white space too."""
_SEEN: set[str] = set()
"""Every password ``split_credentials`` or ``credentials_problem`` read in a URI in this process."""


def _secret_values() -> list[str]:
    values = [
        v
        for k, v in os.environ.items()
        if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET and not k.startswith("PS")
    ]
    return sorted(set(values), key=len, reverse=True)


def _mask_password(match: re.Match[str]) -> str:
    return f"{match.group('head')}:{MASK}@{match.group('host')}"


def _mask_query(uri: str) -> str:
    """``uri`` with the values of its secret-looking query parameters replaced by ``***``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    pairs = parse_qsl(parts.query, keep_blank_values=True) if parts.query else []
    if not any(_SECRET_NAME.search(k) for k, _ in pairs):
        return uri  # nothing secret: unchanged, so sqlite:/// and file:/// keep their slashes
    masked = [(k, MASK if _SECRET_NAME.search(k) else v) for k, v in pairs]
    query = urlencode(masked, safe="*${}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def _mask_seen(text: str) -> str:
    """``text`` without the passwords read in URIs: a long one wherever it is, a short one
    (a word it could be) where it stands between a user's ``:`` and a host's ``@``."""
    for password in sorted(_SEEN, key=len, reverse=True):
        for form in {password, quote(password, safe="")}:
            if len(form) >= _MIN_SECRET:
                text = text.replace(form, MASK)
            else:
                text = text.replace(f":{form}@", f":{MASK}@")
    return text


def redact_uri(uri: str) -> str:
    """``uri`` (one whole URI) with its password and secret-looking query values replaced by
    ``***``."""
    return _mask_query(_WHOLE_USERINFO.sub(_mask_password, _mask_seen(uri), count=1))


def redact(text: object) -> str:
    """``text`` (any object, as str) with every URI's credentials and every secret-looking
    environment value replaced by ``***``."""
    out = str(text)
    whole = _WHOLE_USERINFO.match(out)
    if whole is not None and not re.search(r"\s", out[whole.end() :]):
        out = redact_uri(out)  # one URI, whose password may hold white space
    else:
        out = _USERINFO.sub(_mask_password, _mask_seen(out))
        out = _URI.sub(lambda m: _mask_query(m.group(0)), out)
    for value in _secret_values():
        out = out.replace(value, MASK)
    return out


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """An ``http(s)`` URI with ``user:password@`` in it as (the URI without them, the user, the
    password), both percent-decoded as an HTTP client sends them; any other URI (no password,
    another scheme: a database URI needs its password in the URI) as (``uri``, None, None).
    The password is remembered, so ``redact`` masks it wherever it shows up later."""
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
    _SEEN.update(p for p in (password, unquote(password)) if p)
    return bare, unquote(user), unquote(password)


_ENCODED = {"#": "%23", "?": "%3F", "/": "%2F", "@": "%40", " ": "%20", "%": "%25"}


def credentials_problem(uri: str, option: str) -> str | None:
    """Why the user and password in ``uri`` cannot be read as written, or None: a ``#``, ``?`` or
    ``/`` in them ends a URI's user info there (a URI parser would take the rest for the path,
    query or fragment, and the user for the host), white space or a bad ``%`` escape is no part
    of a URI. The message shows the URI without its password and says what to write instead;
    ``option`` names where the URI was given (``tracking_uri``, ``--tracking-uri``)."""
    whole = _WHOLE_USERINFO.match(uri)
    if whole is None:
        return None
    password = whole.group("password")
    user = whole.group("head").split("://", 1)[1]
    _SEEN.update(p for p in (password, unquote(password)) if p)
    try:
        netloc = urlsplit(uri).netloc
    except ValueError:
        netloc = ""
    where = f"{option} {redact_uri(uri)}"
    read_as = netloc.rsplit("@", 1)[0] if "@" in netloc else None
    reserved = next((c for c in password if c in "#?/"), None)
    if read_as != f"{user}:{password}" and reserved is not None:
        return (
            f"{where}: its password holds {reserved!r}, where a URI's user info ends, so the "
            f"rest would be read as the server's address: percent-encode it ({reserved} as "
            f"{_ENCODED[reserved]}), or leave the user and password out of the URI and set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (if the @ belongs to the "
            "path or query instead, write it as %40)"
        )
    blank = next((c for c in f"{user}:{password}" if c.isspace()), None)
    if blank is not None:
        return (
            f"{where}: its user or password holds white space, which a URI cannot: "
            "percent-encode it (a space as %20), or leave the user and password out of the URI "
            "and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        )
    if re.search(r"%(?![0-9A-Fa-f]{2})", f"{user}:{password}"):
        return (
            f"{where}: its user or password holds a % that starts no percent-escape (%XX): "
            "write a % as %25"
        )
    return None
