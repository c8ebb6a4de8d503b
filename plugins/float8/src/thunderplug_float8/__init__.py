"""torchao float8 training tensors for thunderplug."""
