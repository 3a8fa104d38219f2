"""A request for graphkv's continuous-batching engine (:class:`~graphkv.models.demo_engine.DemoEngine`):
its prompt, how many tokens to generate and the tokens that end it early, checked when it is made."""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Mapping

import attrs

from graphkv.errors import Problem, SpecError
from graphkv.models.prompts import prompt_ids, stop_token_ids
from graphkv.spec._checks import count_arg

__all__ = ["DemoRequest", "request_list"]


def _prompt(value: Any) -> tuple[int, ...]:
    return tuple(prompt_ids(value, "DemoRequest.prompt").tolist())


def _new_tokens(value: Any) -> int:
    return count_arg("DemoRequest.max_new_tokens", value, 1, "pass how many tokens to generate, e.g. 16")


def _stop_ids(value: Any) -> frozenset[int]:
    return stop_token_ids(value, "DemoRequest.stop_token_ids")


@attrs.frozen(kw_only=True)
class DemoRequest:
    """A request: its prompt token ids (a list of ints, a 1-D integer array or tensor; kept as a
    tuple of ints), how many tokens to generate (>= 1), and the token ids that end it early (an
    end-of-sequence token: generated, then the request finishes; ``None``, one id or a list of ids,
    see :func:`~graphkv.models.prompts.stop_token_ids`). Raises :class:`SpecError` for an empty
    prompt, ids that are not integers (or negative stop ids), a count that is not an integer >= 1 or
    an unhashable ``req_id``; :meth:`DemoEngine.add` checks the ids against the model's vocabulary."""

    req_id: Hashable
    prompt: tuple[int, ...] = attrs.field(converter=_prompt)
    max_new_tokens: int = attrs.field(converter=_new_tokens)
    stop_token_ids: frozenset[int] = attrs.field(default=frozenset(), converter=_stop_ids)

    def __attrs_post_init__(self) -> None:
        try:
            hash(self.req_id)
        except TypeError:
            raise SpecError(Problem(field="DemoRequest.req_id", value=self.req_id, limit="must be hashable (it keys "
                                    "the request's batch row)", fix="use a str or int request id")) from None


def request_list(field: str, value: Any) -> tuple[DemoRequest, ...]:
    """``value`` (a list or tuple of :class:`DemoRequest`, or ``None`` for none) as a tuple; :class:`SpecError`
    naming ``field`` otherwise (a lone request included: it is not a list of them)."""
    if value is None:
        return ()
    if isinstance(value, DemoRequest) or isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        example = "request" if isinstance(value, DemoRequest) else "DemoRequest(...)"
        raise SpecError(Problem(field=field, value=type(value).__name__, limit="must be a list of DemoRequest",
                                fix=f"pass a list, e.g. [{example}]"))
    out = tuple(value)
    wrong = [i for i, r in enumerate(out) if not isinstance(r, DemoRequest)]
    if wrong:
        raise SpecError(Problem(field=f"{field}[{wrong[0]}]", value=type(out[wrong[0]]).__name__,
                                limit="must be a DemoRequest",
                                fix="wrap it: DemoRequest(req_id=..., prompt=[...], max_new_tokens=...)"))
    return out
