"""Property tests of the compiler pass over random hybrid models, limits and budgets.

For every generated input, compile either raises a GraphkvError subclass (never any other
exception) or returns a plan whose invariants hold: one max-length request fits the pool with
the null page counted, auto-fit is maximal, Mamba pages are padded to exactly the attention page,
kernel block sizes divide their group's block size and are supported by every backend of the
group, the ledger sums to the budget and every layer sits in exactly one group and one slot.
"""

from collections import Counter

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphkv import (AUTO, Budget, CapacityError, ChunkedLocalSpec, CudaGraphMode, FullAttentionSpec, GraphkvError,
                     IndexerKeySpec, Limits, MambaCacheMode, MambaSpec, MLASpec, ModelKV, SlidingWindowSpec, SpecError,
                     compile_plan)
from graphkv.spec.budget import KNOWN_GPUS

ATTENTION_BACKENDS = ("flash_attn", "flashinfer", "flex", "triton_paged")
MLA_BACKENDS = ("flash_attn_mla", "flashmla", "triton_mla")
STATE_BACKENDS = ("mamba", "gdn", "kda", "lightning", "short_conv")
ATTENTION_DTYPES = ("bfloat16", "float16", "float32", "fp8")
STATE_DTYPES = ("bfloat16", "float16", "float32")


def cdiv(a: int, b: int) -> int:
    """Ceiling division (the tests' own, so the formulas below do not call the code under test)."""
    return -(-a // b)


def reference_pages(spec, block_size: int, max_model_len: int, limits: Limits) -> int:
    """Worst-case pages per request of one group, straight from the DESIGN formulas."""
    in_flight = limits.max_concurrent_batches * limits.max_num_batched_tokens
    if isinstance(spec, MambaSpec):
        mode = limits.mamba_cache_mode
        align = 2 + (1 if spec.variant == "mamba2" else 0)  # Mamba2 keeps a prefill-checkpoint page
        base = {MambaCacheMode.NONE: 1, MambaCacheMode.ALIGN: align}.get(mode) or cdiv(max_model_len, block_size)
        return base + limits.num_speculative_tokens
    if isinstance(spec, SlidingWindowSpec):
        return cdiv(min(spec.window - 1 + limits.extra_retained_tokens + in_flight, max_model_len), block_size) + 1
    if isinstance(spec, ChunkedLocalSpec):
        return cdiv(min(spec.chunk + in_flight, max_model_len), block_size)
    return cdiv(max_model_len, block_size)


def rarely(draw, value, otherwise, one_in: int = 10):
    """``value`` about once in ``one_in`` draws, else ``otherwise``."""
    return value if draw(st.sampled_from([True] + [False] * (one_in - 1))) else otherwise


@st.composite
def attention_specs(draw):
    """A full, sliding-window, chunked-local or (rarely) MLA spec of random size and dtype, with its backends."""
    dtype = draw(st.sampled_from(ATTENTION_DTYPES))
    if rarely(draw, True, False):
        spec = MLASpec(kv_lora_rank=draw(st.sampled_from([256, 512])), rope_dim=64, dtype=dtype)
        return spec, MLA_BACKENDS
    if rarely(draw, True, False, one_in=20):
        return IndexerKeySpec(head_size=draw(st.sampled_from([132, 264]))), ("indexer",)
    common = dict(num_kv_heads=draw(st.sampled_from([1, 2, 4, 8])),
                  head_size=draw(st.sampled_from([32, 64, 96, 128])), dtype=dtype,
                  head_size_v=rarely(draw, draw(st.sampled_from([64, 128])), None),
                  page_size_padded=rarely(draw, draw(st.integers(1, 1 << 20)), None, one_in=20))
    kind = draw(st.sampled_from(["full", "sliding", "chunked"]))
    if kind == "sliding":
        return SlidingWindowSpec(window=draw(st.integers(1, 8192)), **common), ATTENTION_BACKENDS
    if kind == "chunked":
        return ChunkedLocalSpec(chunk=draw(st.integers(1, 8192)), **common), ATTENTION_BACKENDS
    return FullAttentionSpec(**common), ATTENTION_BACKENDS


@st.composite
def mamba_specs(draw):
    """A Mamba state of one or two random shapes and dtypes, sometimes padded by the user."""
    shapes = []
    if draw(st.booleans()):
        shapes.append((draw(st.integers(1, 3)), draw(st.sampled_from([64, 128, 256, 1024, 1536]))))
    shapes.append((draw(st.integers(1, 8)), draw(st.sampled_from([16, 32, 64])), draw(st.sampled_from([16, 64, 128]))))
    dtypes = [draw(st.sampled_from(STATE_DTYPES)) for _ in shapes]
    spec = MambaSpec(shapes=shapes, dtypes=dtypes, chunk_size=draw(st.sampled_from([64, 128, 256])),
                     variant=draw(st.sampled_from(["mamba2", "gated_delta", "mamba1", "kda", "lightning"])))
    if rarely(draw, True, False):
        spec = attrs.evolve(spec, page_size_padded=spec.real_page_size_bytes() + draw(st.integers(0, 4096)))
    return spec


@st.composite
def models(draw):
    """A model of 1-10 layers drawn from up to 3 attention and 2 Mamba templates, each with a compatible backend."""
    attention = draw(st.lists(attention_specs(), min_size=0, max_size=3))
    mamba = draw(st.lists(mamba_specs(), min_size=0 if attention else 1, max_size=2))
    templates = attention + [(s, STATE_BACKENDS) for s in mamba]
    n_layers = draw(st.integers(1, 10))
    layers = []
    for _ in range(n_layers):
        spec, backends = draw(st.sampled_from(templates))
        layers.append((spec, draw(st.sampled_from(backends))))
    cap = draw(st.one_of(st.none(), st.integers(1, 300_000)))
    return ModelKV.from_specs("random", layers, max_position_embeddings=cap,
                              hidden_size=draw(st.one_of(st.none(), st.sampled_from([1024, 4096]))))


@st.composite
def limits_kwargs(draw):
    """Random Limits arguments, occasionally invalid together (Limits must then raise a SpecError)."""
    seqs = draw(st.integers(1, 64))
    tokens = draw(st.integers(seqs, seqs + 8192))
    return dict(
        max_model_len=draw(st.one_of(st.just(AUTO), st.integers(1, 200_000))),
        max_num_seqs=seqs,
        max_num_batched_tokens=rarely(draw, draw(st.integers(1, 64)), tokens),
        num_blocks_override=rarely(draw, draw(st.integers(2, 20_000)), None, one_in=3),
        mamba_cache_mode=draw(st.sampled_from(list(MambaCacheMode))),
        num_speculative_tokens=draw(st.sampled_from([0, 0, 1, 2, 3, 600])),  # 600: above vLLM's 512-token cap
        tensor_parallel_size=rarely(draw, draw(st.sampled_from([1, 2])), None),
        block_size=rarely(draw, draw(st.sampled_from([16, 32, 48, 64, 128, 256, 528])), None, one_in=3),
        mamba_block_size=rarely(draw, draw(st.sampled_from([64, 256, 512])), None),
        cudagraph_mode=draw(st.sampled_from(list(CudaGraphMode))),
        max_concurrent_batches=draw(st.sampled_from([1, 2, 2, 4])),
        speculative_lookahead_tokens=draw(st.sampled_from([0, 0, 1, 3])),
        max_cudagraph_capture_size=rarely(draw, draw(st.integers(1, 9000)), None, one_in=3),
    )


@st.composite
def budgets(draw):
    """None (rarely), bytes between 1 MiB and 64 GiB, or a known GPU at a random utilization."""
    kind = draw(st.sampled_from(["none", "bytes", "bytes", "bytes", "gpu"]))
    if kind == "none":
        return None
    if kind == "bytes":
        return Budget.kv_bytes(int(2 ** draw(st.floats(20, 36))))
    return Budget.for_gpu(draw(st.sampled_from(sorted(KNOWN_GPUS))), utilization=draw(st.floats(0.05, 1.0)))


def check_plan(model: ModelKV, limits: Limits, budget, plan) -> None:
    """Every invariant of a successful plan."""
    cap = model.max_position_embeddings
    usable = plan.num_blocks - 1

    # Pool size: the override exactly, else budget // pool bytes per block; ppb is the slots' sum.
    assert plan.pool_bytes_per_block == sum(s.page_size_bytes for s in plan.slots)
    if limits.num_blocks_override is not None:
        assert plan.num_blocks == limits.num_blocks_override
    else:
        assert plan.num_blocks == budget.kv_pool_bytes() // plan.pool_bytes_per_block

    # One request of max_model_len fits the empty pool, null page counted; pages follow DESIGN formulas.
    assert plan.capacity.pages_per_request <= usable
    for g in plan.groups:
        assert g.pages_per_request == reference_pages(g.spec, g.block_size, plan.max_model_len, limits)
    assert plan.capacity.pages_per_request == sum(g.pages_per_request for g in plan.groups)
    if not limits.is_auto_len:
        assert plan.max_model_len == limits.max_model_len
    if cap is not None:
        assert plan.max_model_len <= cap

    # Auto-fit is maximal: one more token does not fit (unless the position cap stopped it).
    if limits.is_auto_len and plan.max_model_len != cap:
        try:
            compile_plan(model, attrs.evolve(limits, max_model_len=plan.max_model_len + 1), budget)
        except CapacityError:
            pass
        else:
            raise AssertionError(f"max_model_len={plan.max_model_len + 1} also fits: auto-fit is not maximal")

    # Block size: never below a user's, Mamba block size per mode.
    if limits.block_size is not None:
        assert plan.block_size >= limits.block_size
    if model.has_ssm and limits.mamba_cache_mode is MambaCacheMode.ALIGN:
        assert plan.block.mamba_block_size == plan.block_size
    if model.is_hybrid and limits.mamba_cache_mode is MambaCacheMode.ALL:
        assert plan.block.mamba_block_size is not None and plan.block.mamba_block_size <= plan.block_size
    if model.has_ssm and not model.has_attention and limits.mamba_cache_mode is not MambaCacheMode.NONE:
        assert plan.block.mamba_block_size == plan.block_size

    # Mamba pages are padded to exactly the attention page, which holds every real state.
    if model.is_hybrid:
        attention_page = max(g.page_size_bytes for g in plan.groups if not g.is_ssm)
        for original in model.layers:
            if original.spec.is_ssm:
                assert attention_page >= original.spec.page_size_bytes()
                assert attention_page >= original.spec.real_page_size_bytes()
        for layer in plan.layers:
            if layer.spec.is_ssm:
                assert layer.spec.page_size_bytes() == attention_page

    # Kernel block sizes divide the group's block size and every backend of the group supports them.
    backends_by_index = {layer.index: layer.backend for layer in model.layers}
    for g in plan.groups:
        assert g.block_size % g.kernel_block_size == 0
        for index in g.layers:
            backend = backends_by_index[index]
            assert backend.is_ssm or backend.supports(g.kernel_block_size)
        if g.is_ssm:
            assert g.bpk == 1
        assert g.block_table_width == g.pages_per_request * g.bpk
    # The step's (max_num_seqs, pages * bpk) table of every group, packed in one allocation.
    step_rows = {a.name: a for a in plan.ledger.allocations("cuda")}["tables.device"].part("step_rows")
    assert step_rows.shape == (limits.max_num_seqs * sum(g.pages_per_request * g.bpk for g in plan.groups),)

    # Ledger: the KV entries sum to the budget, none negative.
    expected_budget = budget.kv_pool_bytes() if budget is not None else plan.num_blocks * plan.pool_bytes_per_block
    assert plan.ledger.budget_bytes == expected_budget
    assert plan.ledger.kv_total_bytes == expected_budget
    assert all(e.nbytes >= 0 for e in plan.ledger.entries)

    # Slots: all pages equal unless one uniform group gives each layer its own slot.
    uniform = len(plan.groups) == 1 and len({layer.spec for layer in model.layers}) > 1
    if uniform:
        assert [s.page_size_bytes for s in plan.slots] == [
            layer.spec.page_size_bytes(plan.block_size) for layer in plan.layers]
    else:
        assert len({s.page_size_bytes for s in plan.slots}) == 1
        assert {g.page_size_bytes for g in plan.groups} == {plan.slots[0].page_size_bytes}

    # Every layer in exactly one group and one slot.
    every = Counter(layer.index for layer in model.layers)
    assert Counter(i for g in plan.groups for i in g.layers) == every
    assert Counter(i for s in plan.slots for i in s.layers) == every
    assert len(plan.slots) == plan.group_size

    # Capture sizes end at the ceiling (vLLM's min(2 x max_num_seqs x (1 + k), 512) but at least 1 + k, or the limit
    # set, within the step budget): mixed on vLLM's grid (steps of at most 16) or at max_num_batched_tokens, never at
    # max_num_seqs alone; decode sizes are multiples of 1 + k, without speculative tokens the mixed grid's sizes up to
    # max_num_seqs (vLLM's decode keys), with them n x (1 + k) up to the most requests whose tokens fit.
    query_len = 1 + limits.num_speculative_tokens
    ceiling = min(limits.max_cudagraph_capture_size or max(min(2 * limits.max_num_seqs * query_len, 512), query_len),
                  limits.max_num_batched_tokens)
    sizes = plan.cudagraph.capture_sizes
    assert all(size % query_len == 0 for size in sizes.decode)
    if sizes.decode:
        max_reqs = min(limits.max_num_seqs, ceiling // query_len)
        last = sizes.decode[-1] // query_len
        assert last <= max_reqs and (max_reqs - last < min(16, max_reqs) or last in (1, 2, 4))
        if query_len == 1:
            assert last == max_reqs or max_reqs != limits.max_num_batched_tokens
            assert set(sizes.decode) <= set(sizes.mixed) or not sizes.mixed
        else:
            assert last == max_reqs or max_reqs not in (limits.max_num_seqs,
                                                        limits.max_num_batched_tokens // query_len)
    if sizes.mixed:
        assert sizes.mixed[-1] <= ceiling and (ceiling - sizes.mixed[-1] < min(16, ceiling)
                                               or sizes.mixed[-1] in (1, 2, 4))
        assert sizes.mixed[-1] == ceiling or ceiling != limits.max_num_batched_tokens
    assert plan.cudagraph.max_capture_size == max((*sizes.decode, *sizes.mixed), default=0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models(), kwargs=limits_kwargs(), budget=budgets())
def test_compile_raises_graphkv_errors_or_returns_a_consistent_plan(model, kwargs, budget):
    """compile raises only GraphkvError subclasses, and every plan it returns satisfies all invariants."""
    try:
        limits = Limits(**kwargs)
        plan = compile_plan(model, limits, budget)
    except GraphkvError as error:
        assert error.problems and all(p.field and p.fix for p in error.problems)
        return
    check_plan(model, limits, budget, plan)


GARBAGE = st.one_of(st.none(), st.integers(-10, 10), st.sampled_from(["", "x", "bf16", "auto", "ALWAYS"]),
                    st.floats(allow_nan=True), st.booleans(), st.just(()), st.just([(3, 4)]), st.just({}))
VALID_KWARGS = {
    FullAttentionSpec: dict(num_kv_heads=8, head_size=128),
    SlidingWindowSpec: dict(num_kv_heads=8, head_size=128, window=64),
    ChunkedLocalSpec: dict(num_kv_heads=8, head_size=128, chunk=64),
    MLASpec: dict(kv_lora_rank=512, rope_dim=64),
    MambaSpec: dict(shapes=((3, 64), (4, 16, 16)), dtypes=("bfloat16", "float32")),
    Limits: dict(),
    Budget: dict(kv_cache_bytes=1 << 30),
}


@settings(max_examples=300, deadline=None)
@given(cls=st.sampled_from(sorted(VALID_KWARGS, key=lambda c: c.__name__)), data=st.data())
def test_descriptors_reject_garbage_with_spec_errors_only(cls, data):
    """Any field of a descriptor set to a garbage value either builds or raises SpecError, never another error."""
    fields = [f.name for f in attrs.fields(cls)]
    kwargs = dict(VALID_KWARGS[cls])
    for name in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
        kwargs[name] = data.draw(GARBAGE)
    try:
        built = cls(**kwargs)
    except SpecError as error:
        assert isinstance(error, ValueError)
        assert error.problems
        return
    if hasattr(built, "page_size_bytes"):
        assert built.page_size_bytes(16) > 0
