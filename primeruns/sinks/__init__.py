"""Destinations: one module per sink. A sink turns journal entries into
requests and sends a recorded batch; it knows nothing of threads."""
