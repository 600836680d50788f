"""A task's codecs: its payload (validated against the handler's signature, written as
JSON-able data) and its result (kept as JSON), each built once at registration.

JSON has no nan or infinity. pydantic writes one as ``null`` where the type is ``Any`` (a
number typed ``float`` stays a float until the job is encoded, where ``Job.encode`` writes
it as ``NaN`` for the producer to find): the payload codec looks for one in the validated
value itself when the payload's schema has such a part, and refuses it naming its field; the
result codec does not keep such a result (the record says why)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, create_model

from ._text import error_line, quoted
from .context import Context
from .errors import ConfigError
from .job import has_non_finite, non_finite_at, non_finite_in


class PayloadCodec:
    """Validates and serialises a task's payload, built once from the handler's signature.

    - no payload parameter: the payload is ``None``;
    - one parameter annotated with a pydantic model or any type pydantic can validate: the
      payload is that value;
    - several parameters: the payload is an object with one field per parameter.
    """

    def __init__(self, fn: Callable[..., Any], context_type: type) -> None:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        self.ctx_param: str | None = None
        params: list[inspect.Parameter] = []
        for param in sig.parameters.values():
            hint = hints.get(param.name, Any)
            if hint is context_type or param.name == "ctx":
                self.ctx_param = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigError(f"task {fn.__qualname__}: *args/**kwargs are not supported")
            params.append(param)
        self.names = [p.name for p in params]
        self.spread = len(params) > 1
        self.model: type[BaseModel] | None = None
        self.adapter: TypeAdapter[Any] | None = None
        self._constants = False  # the adapter keeps a nan a float (``_adapter``)
        if self.spread:
            fields: dict[str, Any] = {
                p.name: (
                    hints.get(p.name, Any),
                    ... if p.default is inspect.Parameter.empty else p.default,
                )
                for p in params
            }
            self.model = create_model(f"{fn.__name__}_payload", **fields)
        elif params:
            hint = hints.get(params[0].name, Any)
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                self.model = hint
            else:
                self.adapter, self._constants = _adapter(hint)
        self.takes_payload = bool(params)
        #: Payload parameters without a default (a periodic task may have none).
        self.required = [p.name for p in params if p.default is inspect.Parameter.empty]
        self._defaults = {p.name: p.default for p in params}
        #: The payload's schema has a part pydantic writes a nan of as ``null`` (``Any``):
        #: ``dump`` looks for one in the validated value.
        self._lossy = False
        if self.model is not None:
            self._lossy = _has_any(self.model.__pydantic_core_schema__, True)
        elif self.adapter is not None:
            self._lossy = _has_any(self.adapter.core_schema, not self._constants)

    def no_payload(self) -> Any:
        """The payload of a job enqueued without one (a periodic task's tick): None, or the
        handler's defaults (an empty object when it takes several parameters)."""
        if not self.takes_payload:
            return None
        return {} if self.spread else self._defaults[self.names[0]]

    def dump(self, payload: Any) -> Any:
        """Validate ``payload`` and return its JSON-able form; raises ValidationError."""
        if not self.takes_payload:
            if payload is not None:
                raise ConfigError("this task takes no payload; pass None")
            return None
        value: Any
        if self.model is not None:
            value = (
                payload if isinstance(payload, self.model) else self.model.model_validate(payload)
            )
            body = value.model_dump(mode="json")
        else:
            assert self.adapter is not None
            value = self.adapter.validate_python(payload)
            body = self.adapter.dump_python(value, mode="json")
        if self._lossy and has_non_finite(value):
            refuse_non_finite(value)
        return body

    def load(self, raw: Any) -> Any:
        """The handler's payload value from its JSON-able form; raises ValidationError."""
        if self.model is not None:
            return self.model.model_validate(raw)
        if self.adapter is not None:
            return self.adapter.validate_python(raw)
        return None

    def call_args(self, value: Any, ctx: Context) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        if self.ctx_param is not None:
            kwargs[self.ctx_param] = ctx
        if self.spread:
            assert isinstance(value, BaseModel)
            for name in self.names:
                kwargs[name] = getattr(value, name)
            return (), kwargs
        if self.takes_payload:
            kwargs[self.names[0]] = value
        return (), kwargs


class ResultCodec:
    """Serialises a handler's return value as JSON, checked against the handler's return
    annotation when that is a pydantic model, and reads it back."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        hint = typing.get_type_hints(fn).get("return", Any)
        self.model: type[BaseModel] | None = (
            hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None
        )

    def dump(self, value: Any, limit: int | None) -> tuple[str | None, str]:
        """(the value as JSON text, '') or (None, why it cannot be kept)."""
        try:
            if self.model is not None:
                model = value if isinstance(value, self.model) else self.model.model_validate(value)
                text = model.model_dump_json()
                bad = non_finite_at(model)  # the model's own config writes a nan as null
            else:
                text = _ANY.dump_json(value).decode()
                bad = non_finite_in(text.encode(), value)
        except Exception as exc:
            what = "does not match its return annotation" if self.model else "is not JSON"
            return None, f"the result {what}: {error_line(exc)}"
        if bad is not None:  # kept, it would read back as null: not the value returned
            field, number = bad
            what = f"field {quoted(field)} " if field else ""
            return None, f"the result {what}is {number!r}: JSON has no non-finite numbers"
        size = len(text.encode())
        if limit is not None and size > limit:
            return None, f"the result is {size} bytes as JSON, over max_result_bytes of {limit}"
        return text, ""

    def load(self, data: Any) -> Any:
        """The kept value (JSON data) as the handler returned it: a model instance when the
        return annotation is a pydantic model."""
        if self.model is not None and data is not None:
            return self.model.model_validate(data)
        return data


def refuse_non_finite(value: Any) -> None:
    """The ConfigError of a payload that holds a nan or an infinity, naming where."""
    bad = non_finite_at(value)
    if bad is not None:
        field, number = bad
        what = f"payload field {quoted(field)}" if field else "the payload"
        raise ConfigError(f"{what} is {number!r}: JSON has no non-finite numbers")


def _adapter(hint: Any) -> tuple[TypeAdapter[Any], bool]:
    """The payload adapter of a type that is not a model: one that keeps a nan a float in
    its JSON-able form (for the producer's check), True, when the type takes a config;
    else a plain one, False."""
    try:
        return TypeAdapter(hint, config=_CONSTANTS), True
    except Exception:  # a type with a config of its own (a TypedDict or dataclass with one)
        return TypeAdapter(hint), False


def _has_any(schema: Any, in_model: bool) -> bool:
    """True when a pydantic core schema has an ``any`` part that a model's own config
    serialises (``in_model``: the schema is a model's; searched through every dict and list
    of it, definitions included). The adapters here write a nan as ``NaN`` themselves, but
    a model inside one keeps its own config, which writes it as ``null``."""
    stack = [(schema, in_model)]
    while stack:
        node, inside = stack.pop()
        if isinstance(node, dict):
            inside = inside or node.get("type") in _OWN_CONFIG
            if inside and node.get("type") == "any":
                return True
            stack.extend((child, inside) for child in node.values())
        elif isinstance(node, list | tuple):
            stack.extend((child, inside) for child in node)
    return False


#: Core schema types that serialise with a config of their own.
_OWN_CONFIG = frozenset({"model", "dataclass", "typed-dict"})


_CONSTANTS = ConfigDict(ser_json_inf_nan="constants")
#: Strict JSON: a value pydantic cannot serialise (an arbitrary object) is refused, and a
#: nan or an infinity is written as ``NaN``/``Infinity`` for ``non_finite_in`` to find.
_ANY: TypeAdapter[Any] = TypeAdapter(Any, config=_CONSTANTS)
