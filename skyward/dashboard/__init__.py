"""The dashboard: a local web app and HTTP API over this machine's pools (``skyward dashboard``).

This package's ``__init__`` and :mod:`skyward.dashboard.hook` import nothing beyond the
standard library: every pool loads the hook, the server (Starlette, uvicorn) loads only in
``skyward dashboard`` (the ``skyward[dashboard]`` extra).
"""
