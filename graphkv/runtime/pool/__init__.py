"""The KV pool: one raw byte tensor per plan slot (:mod:`.allocate`) and each layer's typed view into it (:mod:`.views`)."""
