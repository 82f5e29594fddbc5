"""akri-trio."""
