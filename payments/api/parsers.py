"""JSON request bodies the database and a UTF-8 response can carry, or a 400."""

from __future__ import annotations

import math
import re
from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

# U+0000 (PostgreSQL text and jsonb refuse it) and unpaired UTF-16 surrogates
# (no UTF-8 encoding exists, so a response quoting one cannot be rendered).
UNREPRESENTABLE_TEXT = re.compile("[\x00\ud800-\udfff]")
# Far deeper than any request needs, far shallower than the recursion limit
# that json.dumps (metadata size check, idempotency fingerprint, jsonb) hits.
MAX_DEPTH = 100


class JSONParser(parsers.JSONParser):
    """DRF's strict JSON parser, also refusing JSON that would end in a 500.

    Valid JSON may spell ``"\\u0000"`` or an unpaired ``"\\ud800"`` in a key or
    a string, a number such as ``1e400`` that parses to infinity (which jsonb
    and strict JSON rendering refuse), or nest deep enough to exhaust Python's
    recursion limit while parsing or later while encoding. Each of these
    reached a service or an error message and came back as a 500 (metadata,
    unknown field names, invalid choices, stored idempotent responses); here
    they are a ``parse_error`` 400.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels.") from None
        problem = unrepresentable(data)
        if problem:
            raise ParseError(f"JSON parse error - {problem}.")
        return data


def unrepresentable(data: Any) -> str | None:
    """Why parsed JSON cannot be stored in jsonb and rendered as UTF-8 JSON, if it cannot.

    Iterative: a recursive walk would itself run out of stack on deep input.
    """
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if UNREPRESENTABLE_TEXT.search(value):
                return "strings must not contain U+0000 or unpaired surrogates"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return "numbers must be finite"
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            children = [*value, *value.values()] if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return None
