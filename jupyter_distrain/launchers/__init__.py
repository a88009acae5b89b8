"""Launchers place slots on hosts and start, signal and stop processes."""
