"""PyTorch side of pipeline planning: measure (layer graph, per-layer profile)."""
