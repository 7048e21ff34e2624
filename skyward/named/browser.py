"""Opening a local web page that needs a secret, without putting the secret on a command line.

``skyward dashboard --open`` and ``skyward notebook --open`` start a browser, whose command line
every local user can read (``ps``). So the browser is given the path of a 0600 page instead,
which posts a one-time code to the server's login address; the server exchanges the code, once,
for its session cookie. The code is worthless once spent or expired, and the page is removed
then (or when the server stops).
"""

from __future__ import annotations

import hmac
import html
import os
import secrets
import tempfile
import threading
import time
import webbrowser
from pathlib import Path

CODE_TTL = 120.0  # seconds a one-time login code is good for (a browser's first start is slow)

_OPEN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>skyward</title></head>
<body><form method="post" action="{action}"><input type="hidden" name="code" value="{code}">
<p>Logging in to {what}... <button type="submit">Open {what}</button></p></form>
<script>document.forms[0].submit()</script></body></html>
"""


class OneTimeCodes:
    """Codes that stand in for a token where the token would be seen; each is good once."""

    def __init__(self) -> None:
        self._codes: dict[str, float] = {}
        self._lock = threading.Lock()

    def issue(self, ttl: float = CODE_TTL) -> str:
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._codes[code] = time.monotonic() + ttl
        return code

    def redeem(self, code: str) -> bool:
        """Spend ``code``: True once for a code issued here that has not expired."""
        now = time.monotonic()
        with self._lock:
            for known, expires in list(self._codes.items()):
                if expires < now:
                    del self._codes[known]
            # Compare each in constant time; pop only the one that matched.
            match = next((k for k in self._codes if hmac.compare_digest(k.encode(), code.encode())), None)
            return match is not None and self._codes.pop(match, None) is not None


def write_open_page(folder: Path, action: str, code: str, what: str = "the dashboard") -> Path:
    """The page a browser is given: it posts ``code`` to ``action`` (0600: the code is a key
    until it is spent)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, name = tempfile.mkstemp(prefix="open-", suffix=".html", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(_OPEN_PAGE.format(action=html.escape(action), code=html.escape(code), what=html.escape(what)))
    return Path(name)


def open_in_browser(page: Path, ttl: float = CODE_TTL, delay: float = 0.5) -> None:
    """Open ``page`` in the user's browser (after ``delay`` s: the server is listening by then)
    and remove it once its code has expired, spent or not."""
    threading.Timer(delay, webbrowser.open, args=(page.as_uri(),)).start()
    expire = threading.Timer(ttl + 1, page.unlink, kwargs={"missing_ok": True})
    expire.daemon = True
    expire.start()
