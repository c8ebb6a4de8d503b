"""nvFuser plugin for thunderplug (CUDA only)."""
