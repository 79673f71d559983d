"""Alluxio client and dataset tier (dataset issue)."""
