"""Draft-head networks, their checkpoint formats, feature capture and training."""
