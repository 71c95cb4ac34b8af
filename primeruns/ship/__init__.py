"""Shipping: one thread per sink that moves the journal to the platform.

The same code ships a live run, a run restarted after a crash, an offline run
synced later and ``primeruns replay``: there is one path to the platform.
"""
