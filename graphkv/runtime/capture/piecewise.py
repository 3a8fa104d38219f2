"""PIECEWISE capture: split a forward's FX graph at the attention ops and capture the pieces
between them, attention running eagerly.

Attention (and any other op that cannot live inside a graph for a mixed batch) is a torch custom
op, e.g. ``torch.library.custom_op("graphkv::attention", mutates_args=...)``. Dynamo keeps such an
op as one node, so :func:`~graphkv.runtime.capture.split.split_at_attention` can cut the graph
there: a forward with ``n`` attention ops becomes up to ``2n + 1`` pieces, ``n`` of them attention,
the rest *graph pieces* (the split lives in :mod:`graphkv.runtime.capture.split`; its names are
re-exported here).

:func:`piecewise_backend` is a ``torch.compile`` backend that does the split and wraps every graph
piece in a :class:`PiecewiseRunner`: inside a :func:`piecewise_capture` block a runner captures
one CUDA graph per input signature (into the shared pool), outside it replays the graph of a
known signature and runs any other signature eagerly. On CPU, and inside the capture of an
enclosing FULL graph, a runner simply runs its piece (the piece then becomes part of the outer
graph). :class:`graphkv.runtime.capture.CapturedForward` opens the capture block for you, after
warming up every size first: a compiled forward recompiles (turns dynamic) while it sees new
sizes, and serving runs on the entry compiled last, so pieces must be captured on that one.

Example::

    compiled = torch.compile(model, backend=piecewise_backend(("graphkv::attention",)))
    # then wrap it: graphkv.capture(plan, static_inputs=...)(compiled).capture()
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence

import attrs
import torch

from graphkv.runtime.capture.dedupe import dedupe_linears
from graphkv.runtime.capture.fuse import compile_pieces, specialize_float_inputs
from graphkv.runtime.capture.regions import inline_regions
from graphkv.runtime.capture.split import SPLITTING_OPS, Piece, SplitResult, op_name, split_at_attention
from graphkv.runtime.capture.staging import StagingArena
from graphkv.runtime.capture.weak import tree_map, weak_outputs, weak_view

__all__ = ["SPLITTING_OPS", "Piece", "PiecewiseBackend", "PiecewiseCaptureScope", "PiecewiseRunner", "SplitResult",
           "capture_graph", "layer_scope", "on_stream", "op_name", "piecewise_backend", "piecewise_capture",
           "prime_blas_workspaces", "release_blas_workspaces", "split_at_attention"]

@attrs.define(kw_only=True)
class PiecewiseCaptureScope:
    """An open :func:`piecewise_capture` block: the pool graphs go into, how many pieces were captured in
    it, how many replayed a graph captured earlier (e.g. by another wrapper of the same forward) and, in
    a rehearsal (``rehearse``: no CUDA graph is captured), how many pieces ran where a capture would."""

    pool: Any
    rehearse: bool = False
    stream: Any = None  # the torch.cuda.Stream pieces are captured on (None: torch's own capture stream)
    staging: StagingArena = attrs.field(factory=StagingArena)  # where pieces read eager ops' outputs from
    num_captured: int = 0
    num_replayed: int = 0
    num_rehearsed: int = 0
    workspaces_in_pool: bool = False  # the capture stream's cuBLAS workspaces were allocated inside ``pool``
    priming: Any = None  # the graph that put them there when this block primed them (prime_blas_workspaces)
    pool_storages: set[int] = attrs.field(factory=set)  # storages of outputs captured in this block (pool memory)


_SCOPE: contextvars.ContextVar[PiecewiseCaptureScope | None] = contextvars.ContextVar("graphkv_piecewise_capture",
                                                                                     default=None)


@contextlib.contextmanager
def piecewise_capture(pool: Any = None, *, rehearse: bool = False, stream: Any = None,
                      staging: StagingArena | None = None,
                      workspaces_in_pool: bool = False) -> Iterator[PiecewiseCaptureScope]:
    """Inside this block, :class:`PiecewiseRunner` s capture a graph for each new input signature
    into ``pool`` (a ``torch.cuda.graph_pool_handle()``; ``None`` makes one on first use), on
    ``stream`` when given (else torch's own capture stream). ``staging``: the arena pieces read the
    eager ops' outputs from; pass one arena to every block of a pool (a new one by default). With
    ``rehearse`` they capture nothing and only count the pieces that would be captured (on any
    device), so a CPU run decides which keys run PIECEWISE exactly as a GPU would.
    ``workspaces_in_pool``: ``stream``'s cuBLAS workspaces are already blocks of ``pool``
    (:func:`prime_blas_workspaces`); otherwise the first piece captured on ``stream`` primes them.
    The scope's attribute of that name says so after the block."""
    token = _SCOPE.set(PiecewiseCaptureScope(pool=pool, rehearse=rehearse, stream=stream,
                                             staging=staging if staging is not None else StagingArena(),
                                             workspaces_in_pool=workspaces_in_pool))
    try:
        yield _SCOPE.get()
    finally:
        _SCOPE.reset(token)


_LAYER: contextvars.ContextVar[Hashable] = contextvars.ContextVar("graphkv_piecewise_layer", default=None)


@contextlib.contextmanager
def layer_scope(key: Hashable) -> Iterator[None]:
    """Inside this block runners key their graphs by ``key`` too (a layer's index, and which call of it in the
    forward): one compiled layer serves every layer of its structure (:mod:`graphkv.hf.layer_compile`), so the same
    runner runs once per layer and step, on each layer's own weights; each call gets graphs of its own (captured on
    its weights, its inputs' addresses), which a replay for another layer, or for a module's second call in the
    same forward, would otherwise reuse. Host only (a context variable)."""
    token = _LAYER.set(key)
    try:
        yield
    finally:
        _LAYER.reset(token)


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[None]:
    """Run the block on ``stream`` (a ``torch.cuda.Stream``), after the current stream's work so far
    and before its next: torch's side-stream recipe for warm-ups and captures."""
    current = torch.cuda.current_stream()
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield
    current.wait_stream(stream)


def capture_graph(fn: Callable[[], Any], pool: Any, stream: Any = None, *,
                  release_workspaces: bool = True) -> tuple[Any, Any]:
    """Capture ``fn()`` into a new CUDA graph allocating from ``pool``; return ``(graph, outputs)``.

    ``stream``: the ``torch.cuda.Stream`` to capture on (default: torch's class-level capture
    stream, through ``torch.cuda.graph``); pass the same one for every graph of a pool. ``outputs``
    are owned and hold nothing yet (a capture only records; the first ``graph.replay()`` writes
    them); each replay rewrites them. The one place graphkv captures.

    ``release_workspaces`` (default): free the cuBLAS workspaces first (:func:`release_blas_workspaces`),
    so that the capture's matmuls allocate theirs from ``pool``. Pass ``False`` after
    :func:`prime_blas_workspaces` put ``stream``'s in ``pool`` (pool blocks, kept by cuBLAS's cache).

    With a ``stream``, the capture skips what ``torch.cuda.graph`` does before every capture — a device
    synchronize, ``empty_cache`` (which hands every cached block back to the driver, so the eager ops
    between pieces allocate anew) and the pinned-host cache's release. A PIECEWISE key captures one
    graph per piece (17 for a 16-layer model), so those dominated set-up (vLLM likewise skips the
    cache release and the garbage collection after its first graph).
    """
    graph = torch.cuda.CUDAGraph()
    if release_workspaces:
        release_blas_workspaces()  # the capture's matmuls then take their workspace from ``pool``
    if stream is None:
        with torch.cuda.graph(graph, pool=pool):  # torch's class-level capture stream
            outputs = fn()
        return graph, outputs
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        try:
            outputs = fn()
        finally:
            graph.capture_end()
    return graph, outputs


def prime_blas_workspaces(pool: Any, stream: Any) -> Any:
    """Put ``stream``'s cuBLAS and cuBLASLt workspaces inside ``pool``: release the cached ones
    (:func:`release_blas_workspaces`), then capture a small matmul and a linear with a bias (cuBLASLt's
    path), in float32 and bfloat16, into ``pool`` on ``stream``, so that cuBLAS allocates the
    stream's workspaces during a capture, from the pool. Every later capture on ``stream`` into
    ``pool`` then finds them there and need not release them; eager matmuls on ``stream`` (warm-ups,
    state mixers between pieces) use them too, so none is allocated outside the pool.

    Why a capture of its own: the first graph of a key may run no matmul (a hybrid model's first
    piece is the embedding and a norm; its mixer's projections run eagerly, between pieces), and a
    workspace an eager matmul then allocated outside the pool would be recorded by every later
    graph and freed under them by the final release. Returns the priming graph: keep it as long as
    the pool's graphs. CUDA only. Only ``stream``'s workspaces are primed: a forward that runs
    matmuls on a stream of its own between pieces is not covered."""
    release_blas_workspaces()
    device = getattr(stream, "device", None) or torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.stream(stream):
        inputs = [torch.ones(16, 16, dtype=dtype, device=device) for dtype in (torch.float32, torch.bfloat16)]
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=pool)
        try:
            for x in inputs:
                torch.matmul(x, x)
                torch.nn.functional.linear(x, x, x[0])
        finally:
            graph.capture_end()
    return graph


def release_blas_workspaces() -> None:
    """Free PyTorch's cached cuBLAS and cuBLASLt workspaces (every stream's), after a synchronize, so that
    the next matmul on a stream allocates its workspace anew: inside a capture, from the graph's pool.

    Why before a pool's first capture (:func:`prime_blas_workspaces`): a graph whose matmuls ran on a
    workspace allocated outside its pool (by a warm-up on the capture stream) reads memory that only
    PyTorch's workspace cache holds. PyTorch's cudagraph trees (``torch.compile(mode="reduce-overhead")``,
    e.g. transformers' static-cache ``generate``) free those caches before they record and then empty the
    allocator's cache, which returns that memory to the driver; the graph's next replay then faults (an
    illegal memory access on an H100, 2026-11-26, after transformers' compiled ``generate`` ran beside
    graphkv). Inside the pool the workspace stays mapped while the pool's graphs live.
    :class:`~graphkv.runtime.capture.graphs.CapturedForward` primes them after its warm-ups and releases
    them after its last capture (so that no later matmul on the capture stream writes the pool block its
    graphs use as scratch), as PyTorch's cudagraph trees release them around each recording. Other
    libraries' graphs captured on workspaces outside their pools are exposed to this, as they are to
    cudagraph trees."""
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def graph_device(device: torch.device) -> bool:
    """Whether tensors on ``device`` can be captured in a CUDA graph (CUDA devices only)."""
    return device.type == "cuda"


def _cuda_graphs_apply(t: torch.Tensor) -> bool:
    """Whether a runner may replay/capture: the piece runs on CUDA and no enclosing capture is open."""
    return t.device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    """A graph's key: each argument's shape, strides, dtype and device (a non-tensor by value), and the layer of an
    open :func:`layer_scope` (``None`` outside one)."""
    return (_LAYER.get(),) + tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor)
                                   else a for a in args)


@attrs.define
class _PieceGraph:
    graph: Any  # torch.cuda.CUDAGraph
    static_args: tuple[Any, ...]  # the tensors the graph reads (None for non-tensor args)
    outputs: Any  # weak views of the outputs the graph writes (graphkv.runtime.capture.weak)
    keep: Any = None  # the priming graph when this piece's capture primed the pool's workspaces (kept with it)


class PiecewiseRunner(torch.nn.Module):
    """Runs one graph piece: replays its CUDA graph for a captured input signature, captures one
    inside a :func:`piecewise_capture` block, runs eagerly otherwise (always on CPU).

    Replay copies an input into the captured input tensor only when its address changed (an
    attention output allocated per call); outputs of the previous piece keep their address, so
    they pass through without a copy. Outputs are graph-pool memory that every graph of the pool
    shares (weak views, :mod:`graphkv.runtime.capture.weak`): valid until the next replay of any
    graph of the pool, and only while a graph of the pool lives.

    ``staged_args``: positions of the arguments an eager op computes per call (the splitting ops'
    outputs); a capture reads them from the scope's :class:`StagingArena`, shared by every piece,
    instead of keeping a static copy of its own. Other arguments are kept as they were captured:
    weak views where a piece of the same block produced them (pool memory), else owned (weights,
    static inputs, the KV pool).
    """

    def __init__(self, piece: torch.nn.Module, index: int = 0, staged_args: Iterable[int] = ()) -> None:
        super().__init__()
        self.piece = piece
        self.index = index
        self.staged_args = frozenset(staged_args)
        self._graphs: dict[tuple[Any, ...], _PieceGraph] = {}

    @property
    def num_graphs(self) -> int:
        """Graphs captured so far (one per input signature)."""
        return len(self._graphs)

    def forward(self, *args: Any) -> Any:
        scope = _SCOPE.get()
        if scope is not None and scope.rehearse:
            scope.num_rehearsed += 1  # a rehearsal: the piece runs eagerly where it would be captured
            return self.piece(*args)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None or not _cuda_graphs_apply(first):
            return self.piece(*args)  # CPU, or part of an enclosing FULL capture
        signature = _signature(args)
        entry = self._graphs.get(signature)
        if entry is None:
            if scope is None:
                return self.piece(*args)
            entry, outputs = self._capture(args, scope)
            self._graphs[signature] = entry
            self._stage(entry, args)
            entry.graph.replay()  # a capture only records: the forward goes on with the values a replay writes
            return outputs
        if scope is not None:  # known inside another key's capture: a replay would write into pool blocks that
            scope.num_replayed += 1  # this capture may have handed to live tensors, so the piece runs eagerly
            return self.piece(*args)
        self._stage(entry, args)
        entry.graph.replay()
        return entry.outputs

    @staticmethod
    def _stage(entry: _PieceGraph, args: Sequence[Any]) -> None:
        """Copy each argument whose address differs from the captured one into the captured input."""
        for static, arg in zip(entry.static_args, args):
            if static is not None and static.data_ptr() != arg.data_ptr():
                static.copy_(arg)

    def _capture(self, args: Sequence[Any], scope: PiecewiseCaptureScope) -> tuple[_PieceGraph, Any]:
        """Warm up and capture the piece on ``args``; returns its entry (weak outputs) and the owned
        outputs, which the forward being captured uses (their blocks return to the pool when it is done)."""
        if scope.pool is None:
            scope.pool = torch.cuda.graph_pool_handle()
        priming = None
        if not scope.workspaces_in_pool and scope.stream is not None:  # before the warm-up's matmuls
            priming = scope.priming = prime_blas_workspaces(scope.pool, scope.stream)
            scope.workspaces_in_pool = True
        staged = [i for i, a in enumerate(args) if i in self.staged_args and isinstance(a, torch.Tensor)]
        inputs = list(args)
        for i, view in zip(staged, scope.staging.stage([args[i] for i in staged])):
            inputs[i] = view
        self.piece(*inputs)  # warm-up: lazy init and autotuning must not happen during capture
        graph, outputs = capture_graph(lambda: self.piece(*inputs), scope.pool, scope.stream,
                                       release_workspaces=not scope.workspaces_in_pool)
        scope.num_captured += 1
        static = tuple((weak_view(a) if a.untyped_storage().data_ptr() in scope.pool_storages else a)
                       if isinstance(a, torch.Tensor) else None for a in inputs)
        tree_map(lambda t: scope.pool_storages.add(t.untyped_storage().data_ptr()), outputs)
        return _PieceGraph(graph=graph, static_args=static, outputs=weak_outputs(outputs), keep=priming), outputs


class _CallableModule(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


CaptureFn = Callable[[torch.nn.Module, int], Callable[..., Any]]  # (piece module, piece index) -> runner


class PiecewiseBackend:
    """A ``torch.compile`` backend: split each dynamo graph at ``splitting_ops`` and wrap every
    graph piece with ``capture_fn(piece_module, piece_index)`` (default :class:`PiecewiseRunner`).

    ``splits`` keeps one :class:`SplitResult` per compiled graph (several after recompiles or
    graph breaks), with the runners installed on ``split.module``; ``runners`` lists them and
    ``num_fused`` counts the pieces compiled by Inductor and ``num_compiles`` the Inductor compiles they took
    (pieces of the same structure share one, :func:`~graphkv.runtime.capture.fuse.piece_key`). Before the split, a
    matmul repeated with the same arguments is kept once (:func:`~graphkv.runtime.capture.dedupe.dedupe_linears`:
    merged projections' groups, :mod:`graphkv.hf.projections`); ``num_deduped`` counts those removed.
    ``fuse``: compile each graph piece with Inductor first (:mod:`graphkv.runtime.capture.fuse`:
    its elementwise ops and reductions fused, a few kernels around the matmuls); the runners then
    capture and replay the compiled pieces. Default: the pieces run as traced, op by op.
    ``small_matmul_kernels`` (``"auto"`` / ``"triton"``): every ``linear`` call runs as ``graphkv::small_linear``
    (:func:`~graphkv.runtime.capture.small_matmuls.route_small_matmuls`; graphkv's small-matmul kernel for steps of a
    few tokens, where that choice resolves to Triton), counted in ``num_small_matmuls``. Default ``None`` (and
    ``"torch"``): torch's matmuls, nothing routed. Calls of nested compile regions (layers Dynamo traced once,
    :mod:`~graphkv.runtime.capture.regions`) are inlined before anything else, counted in ``num_inlined``.
    """

    def __init__(self, splitting_ops: Iterable[Any] = SPLITTING_OPS, capture_fn: CaptureFn | None = None, *,
                 fuse: bool = False, small_matmul_kernels: str | None = None) -> None:
        if small_matmul_kernels is not None:  # a bad choice is refused here, not at the first trace
            from graphkv.runtime.ops.choice import resolve_kernels  # needs Triton, as the kernel does

            resolve_kernels(small_matmul_kernels, "cpu")
        self.splitting_ops = tuple(op_name(op) for op in splitting_ops)
        self.capture_fn = PiecewiseRunner if capture_fn is None else capture_fn
        self.fuse = fuse
        self.small_matmul_kernels = small_matmul_kernels
        self.splits: list[SplitResult] = []
        self.runners: list[torch.nn.Module] = []
        self.num_fused = 0  # graph pieces compiled by Inductor (``fuse``), over every split
        self.num_compiles = 0  # Inductor compiles those took (one per distinct piece)
        self.num_deduped = 0  # repeated matmuls kept once (dedupe_linears), over every trace
        self.num_small_matmuls = 0  # linear calls routed through graphkv::small_linear, over every trace
        self.num_inlined = 0  # nested compile regions' calls inlined before the split (regions), over every trace

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        inlined = inline_regions(gm)  # layers traced once (nested compile regions), put back in the forward
        if self.fuse:
            specialize_float_inputs(gm)  # dynamic=True's float inputs: traced again as constants
        deduped = dedupe_linears(gm)  # merged projections' repeated matmul (graphkv.hf.projections)
        routed = 0
        if self.small_matmul_kernels in ("auto", "triton"):  # after dedupe_linears (it merges linear calls, not the op)
            from graphkv.runtime.capture.small_matmuls import route_small_matmuls

            routed = route_small_matmuls(gm, self.small_matmul_kernels)
        split = split_at_attention(gm, self.splitting_ops)
        compiled: dict[str, Callable[..., Any]] = {}
        if self.fuse:
            pieces = compile_pieces(split, gm)
            compiled = pieces.callables
            self.num_fused += len(compiled)
            self.num_compiles += pieces.num_compiles
        for piece in split.graph_pieces:
            module = _CallableModule(compiled[piece.name]) if piece.name in compiled else piece.module
            if self.capture_fn is PiecewiseRunner:
                runner = PiecewiseRunner(module, piece.index, staged_args=split.eager_args(piece))
            else:
                runner = self.capture_fn(module, piece.index)
            if not isinstance(runner, torch.nn.Module):
                runner = _CallableModule(runner)
            setattr(split.module, piece.name, runner)
            self.runners.append(runner)
        self.splits.append(split)
        # counted once the trace is through (a restart or a failure traces it again)
        self.num_inlined, self.num_deduped, self.num_small_matmuls = (
            self.num_inlined + inlined, self.num_deduped + deduped, self.num_small_matmuls + routed)
        return split.module


def piecewise_backend(splitting_ops: Iterable[Any] = SPLITTING_OPS, capture_fn: CaptureFn | None = None, *,
                      fuse: bool = False, small_matmul_kernels: str | None = None) -> PiecewiseBackend:
    """A ``torch.compile(backend=...)`` that splits at ``splitting_ops`` and captures the pieces
    between them, each compiled by Inductor first with ``fuse``, its linear calls through graphkv's small-matmul
    kernel with ``small_matmul_kernels`` (see :class:`PiecewiseBackend`)."""
    return PiecewiseBackend(splitting_ops, capture_fn, fuse=fuse, small_matmul_kernels=small_matmul_kernels)
