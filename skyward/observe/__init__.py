"""Observability: the typed event stream and its views (console, log file, sky.App), and the
redaction of secrets from all of them."""
