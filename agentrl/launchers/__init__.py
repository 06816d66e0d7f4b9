"""Launchers: place the one training loop's processes (policy workers, engines) on a cluster."""
