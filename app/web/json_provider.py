"""Flask's JSON responses, encoded by orjson (see app.storage.core.encoding.dumps_compact)."""

from __future__ import annotations

from typing import Any

from flask import Response
from flask.json.provider import DefaultJSONProvider

from app.storage.core.encoding import dumps_compact


class JSONProvider(DefaultJSONProvider):
    """Keys in the order the view built them, UTF-8 rather than \\u escapes."""

    sort_keys = False
    ensure_ascii = False

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        if kwargs:  # a caller asked for options orjson does not have
            return super().dumps(obj, **kwargs)
        return dumps_compact(obj, self.default).decode("utf-8")

    def response(self, *args: Any, **kwargs: Any) -> Response:
        obj = self._prepare_response_obj(args, kwargs)
        body = dumps_compact(obj, self.default) + b"\n"
        return Response(body, mimetype=self.mimetype)
