"""Helpers used inside running tasks: instance_info, shard, output control."""
