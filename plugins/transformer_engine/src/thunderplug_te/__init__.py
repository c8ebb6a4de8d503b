"""Transformer Engine plugin for thunderplug (CUDA only)."""
