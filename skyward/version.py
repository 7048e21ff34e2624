"""The version of skyward (the same as pyproject.toml's).

Its own module so that the modules that write it down (audit entries, locks, records, stack
config) read it without importing the package, whose ``__init__`` imports the public API.
"""

__version__ = "0.1.0"
