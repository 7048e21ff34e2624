"""No page of the dashboard may be shown inside another page's frame.

A page on any other port of this host (another local user's, say) could otherwise hold the
logged-in dashboard in a transparent frame under decoy buttons: the browser sends the session
cookie to every port of the host, and the frame's origin keeps its key, so clicks in the frame
would stop, start or resize pools. ``NoFraming`` wraps the whole app, outside Starlette's own
error handling, so every response says so: pages, the API, static files, 401s, 404s, 405s
and the 500 of an unhandled error. The pages themselves refuse to act inside a frame too
(``dashboard.js``), for a browser that ignores the headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Both: X-Frame-Options for older browsers, the CSP directive that replaced it for the rest.
HEADERS = ((b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"))


class NoFraming:
    """ASGI middleware: every HTTP response carries ``HEADERS`` (an X-Frame-Options the app
    set is replaced; a Content-Security-Policy it set stays, and ours is enforced beside it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if bytes(k).lower() != b"x-frame-options"]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self.app(scope, receive, guarded)
