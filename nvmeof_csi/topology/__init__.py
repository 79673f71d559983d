"""Fabric map and topology segments (controller issue)."""
