"""Adapters between the decode loop and model libraries."""
