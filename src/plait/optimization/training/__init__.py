"""Feedback learning (being split into this folder)."""
