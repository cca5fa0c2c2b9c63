"""Fusebox metrics sidecar."""
