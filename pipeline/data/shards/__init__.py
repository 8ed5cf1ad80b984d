"""Shards: the container format, index.json, reader, writer, and the shard stage that makes them."""
