"""SSH test hosts (a package so its conftest does not shadow tests/conftest.py as `conftest`)."""
