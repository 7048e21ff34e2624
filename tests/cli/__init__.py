"""The skyward CLI against real Local pools (a package so its conftest does not shadow tests/conftest.py)."""
