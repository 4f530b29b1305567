"""Request bodies as the gateway reads them: parsed once, `model` respelled in place.

Vocabulary:
- model span: where the value of the top-level `model` key lies in the body's text (the
  last one, when the key repeats: that is the one a JSON parser keeps).
- served name: the model name the engine answers to (`ServiceEndpoints.served_model`).

Invariants:
- `parse` accepts exactly what `json.loads` accepts for a top-level object (it is
  json.loads) and names what it refuses.
- `with_model` changes only the bytes of the model span: the rest of the body reaches the
  engine as the client sent it (no re-serialisation: numbers, key order and escapes are
  kept). When the caller already spelled the served name, the body is passed on as is;
  otherwise the span is found by a walk of the top level with the json module's C scanner
  (measured: about 2x cheaper than json.dumps of a 100 KB chat body).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring
from json.scanner import make_scanner

_WS = re.compile(r"[ \t\n\r]*")
_SCAN = make_scanner(json.JSONDecoder())  # the C scanner where there is one


class BodyError(ValueError):
    """The body is not a JSON object the gateway can read: say so with a 400."""


@dataclass(frozen=True)
class Body:
    raw: bytes
    doc: dict

    @property
    def model(self) -> str | None:
        m = self.doc.get("model")
        return m if isinstance(m, str) else None

    def with_model(self, served: str) -> bytes:
        """The body for the engine: `model` respelled as `served` (the very same bytes when
        it already is, the common case, which costs nothing more than the parse)."""
        if self.model == served or self.model is None:
            return self.raw
        text = self.raw.decode(json.detect_encoding(self.raw), "surrogatepass")
        start, end = model_span(text)
        return (text[:start] + json.dumps(served) + text[end:]).encode("utf-8", "surrogatepass")


def parse(raw: bytes) -> Body:
    """The body as a JSON object; BodyError when it is not one."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise BodyError("the request body nests JSON too deeply") from None
    except ValueError:  # UnicodeDecodeError included
        raise BodyError("the request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise BodyError("the request body must be a JSON object")
    return Body(raw, doc)


def model_span(text: str) -> tuple[int, int]:
    """(start, end) of the value of the last top-level `model` key of a JSON object that
    parses (the one json.loads keeps), found by walking the top level with the json module's
    own scanner; ValueError when there is none."""
    span = None
    i = _WS.match(text, 1 if text.startswith("\ufeff") else 0).end()
    if text[i : i + 1] != "{":
        raise ValueError("not an object")
    i = _WS.match(text, i + 1).end()
    while text[i : i + 1] == '"':
        key, i = scanstring(text, i + 1)
        i = _WS.match(text, i).end() + 1  # past the ':'
        i = _WS.match(text, i).end()
        _value, end = _SCAN(text, i)
        if key == "model":
            span = (i, end)
        i = _WS.match(text, end).end()
        if text[i : i + 1] != ",":
            break
        i = _WS.match(text, i + 1).end()
    if span is None:
        raise ValueError("no top-level model")
    return span
