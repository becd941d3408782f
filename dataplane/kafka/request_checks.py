"""Kafka's schema rules that kafka-python's decoder does not enforce, checked on demand.

kafka-python decodes a null array or string (length -1) in any field, also where Kafka's
schema does not allow null: Kafka's own parser refuses such a request (InvalidRequestException)
and closes the connection. Checking every request would cost the produce path a walk over
its fields, so `forbidden_null` is asked only when a handler fails: the connection then
closes as Kafka's would, with a warning that names the field, instead of an error traceback.

Pure functions: no I/O, no state.
"""

from __future__ import annotations

from typing import Any

__all__ = ["forbidden_null"]

_MAX_CHECKED_ITEMS = 10_000  # elements of one array looked at (a request is bounded anyway)


def forbidden_null(body: Any, api_version: int) -> str | None:
    """The path of the first field of a decoded request that is null where Kafka's schema
    forbids null at `api_version` (e.g. "topics[0].partitions"), or None."""
    struct = getattr(type(body), "_struct", None)
    if struct is None:
        return None
    return _check(body, struct, api_version, "")


def _check(value: Any, struct: Any, version: int, path: str) -> str | None:
    for name, field in struct.fields.items():
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue  # absent at this version, or tagged (absent means its default)
        item = getattr(value, name, None)
        where = f"{path}{name}"
        if item is None:
            if not field.nullable_for_version_q(version) and (
                field.is_array() or field.is_struct() or _is_nullable_kind(field)
            ):
                return where
            continue
        if field.is_struct_array():
            for index, element in enumerate(item[:_MAX_CHECKED_ITEMS]):
                if element is None:
                    return f"{where}[{index}]"
                found = _check(element, field, version, f"{where}[{index}].")
                if found is not None:
                    return found
        elif field.is_struct():
            found = _check(item, field, version, f"{where}.")
            if found is not None:
                return found
    return None


def _is_nullable_kind(field: Any) -> bool:
    """A string, bytes or records field: the kinds Kafka may encode as null."""
    return getattr(field, "type_str", "") in ("string", "bytes", "records")
