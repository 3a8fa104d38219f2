"""The serving-stack step: a :class:`~.batch.Batch` in, persistent buffers filled, page ownership enforced, the
forward run inside a scoped :mod:`.context`."""
