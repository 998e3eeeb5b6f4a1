"""Adapters to engines users already run (``integrations.ray``: Ray Serve and Ray Data).

Each integration is an optional extra; importing this package imports none of them.
"""
