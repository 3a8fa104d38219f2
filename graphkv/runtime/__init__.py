"""The runtime: allocate a Plan once, fill persistent buffers per step."""
