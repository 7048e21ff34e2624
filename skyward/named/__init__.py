"""Named pools and the ``skyward`` command: the registry, ``skyward.toml``, the CLI and the
scripts it runs (``skyward run``)."""
