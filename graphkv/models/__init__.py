"""Small models that exercise graphkv end to end (random weights, no downloads)."""
