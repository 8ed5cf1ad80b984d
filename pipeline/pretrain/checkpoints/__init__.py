"""Checkpoints: their storage (folders, records, checksums) apart from the policy of when to save and where to start."""
