"""Fusebox hardened inference server."""
