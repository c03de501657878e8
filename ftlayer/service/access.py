"""Who may read what the sidecar serves: the operations surface split by audience.

* ``/metrics``, ``/healthz``, ``/readyz``: counts and states, no record's data -- open to
  whoever reaches the port (Prometheus, the kubelet), however wide it is bound.
* ``/`` (the status page) and ``/api/status``: the newest dead letters with their errors
  and, unless turned off, a preview of their payloads -- records' data. Bound to loopback
  they are open, as before (only the machine's own users reach them). Bound wider they
  answer only with the status token (``--status-token`` / ``FTLAYER_STATUS_TOKEN``):
  ``Authorization: Bearer <token>``, or the cookie that a link with ``?token=<token>``
  sets once (the answer redirects to the same page without the token in its address).
  Bound wider with no token they answer 401 and say how to set one.
* Payload previews are off by default whenever the page is reachable beyond loopback
  (``--payload-preview`` turns them on; ``--no-payload-preview`` off on loopback too).

Invariants: a token is compared in constant time; the cookie holds a digest of the token,
never the token; nothing here changes state beyond setting that cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

__all__ = ["COOKIE", "Access", "is_loopback"]

COOKIE = "ftlayer_status"
"""The cookie a ``?token=`` link sets."""
PRIVATE = frozenset({"/", "/index.html", "/api/status"})
"""The paths that show records' data."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the port on this machine (``localhost``, 127/8,
    ``::1``); a wildcard (``0.0.0.0``, ``::``) or any other address does not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


@dataclass(frozen=True)
class Access:
    """The sidecar's HTTP access rules: bound beyond loopback (``wide``), the status token
    (None: none set) and whether dead letters' payloads are previewed."""

    wide: bool
    token: str | None
    previews: bool

    @classmethod
    def of(cls, host: str, token: str | None = None, previews: bool | None = None) -> Access:
        """The rules of a server bound to ``host``; ``previews`` None: on for loopback,
        off beyond it."""
        wide = not is_loopback(host)
        return cls(wide, token or None, (not wide) if previews is None else previews)

    @property
    def guarded(self) -> bool:
        """Whether the private paths ask for the token."""
        return self.wide or self.token is not None

    def answer(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes] | None:
        """None when the request may read its path; else the answer to give instead
        (status, headers, body): 401 without the token, 303 to the same page (with the
        cookie set) for a ``?token=`` link."""
        if environ.get("PATH_INFO", "/") not in PRIVATE or not self.guarded:
            return None
        if self.token is None:
            return _refused("the status page shows records' data and this sidecar is bound "
                            "beyond loopback: start it with --status-token "
                            "(FTLAYER_STATUS_TOKEN) to open it to whoever has the token\n")
        given = parse_qs(environ.get("QUERY_STRING", "")).get("token")
        if given:
            if not self._matches(given[0]):
                return _refused("wrong token\n")
            cookie = (f"{COOKIE}={self._digest()}; Path=/; HttpOnly; SameSite=Strict; "
                      "Max-Age=2592000")  # fmt: skip
            # relative: right behind a proxy that serves the page under a prefix too
            where = environ.get("PATH_INFO", "/").rsplit("/", 1)[-1] or "./"
            return "303 See Other", [("Location", where), ("Set-Cookie", cookie),
                                     ("Cache-Control", "no-store")], b""  # fmt: skip
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth.startswith("Bearer ") and self._matches(auth[len("Bearer "):].strip()):
            return None
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(environ.get("HTTP_COOKIE", ""))
        except Exception:  # noqa: BLE001 -- a malformed cookie header is no login
            jar = SimpleCookie()
        if COOKIE in jar and hmac.compare_digest(jar[COOKIE].value, self._digest()):
            return None
        return _refused("this page needs the status token: an Authorization: Bearer header, "
                        "or open it once as /?token=<token> (ftlayer status --open does)\n")

    def _matches(self, given: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _digest(self) -> str:
        assert self.token is not None
        return hashlib.sha256(b"ftlayer-status:" + self.token.encode()).hexdigest()


def _refused(text: str) -> tuple[str, list[tuple[str, str]], bytes]:
    body = text.encode()
    return "401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                ("Content-Length", str(len(body))),
                                ("WWW-Authenticate", 'Bearer realm="ftlayer status"'),
                                ("Cache-Control", "no-store")], body  # fmt: skip
