"""An HTTP tool's receiver for the tools benchmark: `python -m bench.tool_receiver PORT SECRET`.

Checks the signature as docs/tools.md tells receivers to and answers with the `text` argument, so the
benchmark's HTTP tool does as little as the MCP servers' `echo`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys

from aiohttp import web


def app(secret: bytes) -> web.Application:
    async def tool(request: web.Request) -> web.Response:
        body = await request.read()
        stamp = request.headers.get("X-Parley-Timestamp", "")
        expected = "sha256=" + hmac.new(secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(request.headers.get("X-Parley-Signature", ""), expected):
            return web.Response(status=401, text="bad signature")
        return web.Response(text=str(json.loads(body).get("text", "")))

    application = web.Application()
    application.add_routes([web.post("/tool", tool)])
    return application


if __name__ == "__main__":
    web.run_app(app(sys.argv[2].encode()), host="127.0.0.1", port=int(sys.argv[1]), print=None)
