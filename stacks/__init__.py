"""Pulumi stacks for cloud pools (arrives with the stacks issue)."""
