"""Providers: one module per way of getting nodes (Local, SSH, AWS, GCP)."""
