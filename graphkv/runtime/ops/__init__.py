"""Runtime kernels by device: which implementation runs (:mod:`.choice`), the torch versions (:mod:`.torch_ops`) and
the one pure-torch reference every implementation is checked against (:mod:`.reference`)."""
