"""Shared plumbing: config tree, errors, process topology, atomic files, stop signals."""
