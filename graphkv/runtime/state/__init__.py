"""Recurrent (state) layers over packed, variable-length steps, their states in the pool's state pages.

A step packs the tokens of many requests, prefill chunks and decodes mixed; a state layer must run
each request's recurrence from that request's own state and write the new state back to its page.
:class:`PackedRows` says which batch row each token belongs to (computed once per forward, read by
every state layer), and the ops run the whole step at once with vectorized torch (no loop over
requests or tokens):

- :func:`~graphkv.runtime.state.conv.packed_causal_conv`: the depthwise causal convolution, its
  ``(conv_kernel - 1, channels)`` state carried across chunks;
- :func:`~graphkv.runtime.state.gated_delta.packed_gated_delta`: the gated delta rule
  (Qwen3-Next, Qwen3.5, Olmo-Hybrid), state ``(heads, value_dim, key_dim)`` (the plan's, vLLM's layout);
- :func:`~graphkv.runtime.state.ssd.packed_ssd`: Mamba2's state-space duality scan (scalar decay per
  head), state ``(heads, head_dim, state_size)``.

The step is one chunk: tokens interact through ``[heads, T, T]`` matrices masked by request, so
the cost grows with the square of the step's token count (``max_num_batched_tokens``). That is
right for the CPU tests and small models; a GPU stack serving long prefills would call varlen
kernels (flash-linear-attention, mamba-ssm) on the same packing.
"""
