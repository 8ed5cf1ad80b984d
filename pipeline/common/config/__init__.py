"""Config plumbing: JSON to typed dataclass trees, --set overrides, command lines from dataclasses, shipped configs,
size bounds."""
