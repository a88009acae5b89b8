"""Backends turn placed slots into processes (argv + env) and driver-side services."""
