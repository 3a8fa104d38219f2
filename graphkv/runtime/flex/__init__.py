"""Paged flex attention: mask geometry from the plan, in-place mask builds, the flat K/V views and the attention call."""
