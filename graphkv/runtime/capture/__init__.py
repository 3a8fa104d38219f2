"""CUDA-graph capture: graph keys and dispatch (:mod:`.keys`), captured forwards (:mod:`.graphs`), PIECEWISE
splitting (:mod:`.piecewise`) and the static input buffers graphs read (:mod:`.static_inputs`)."""
