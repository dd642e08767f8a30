"""The HTTP monitor: a FastAPI app that reads counters the gateway already keeps."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Response

from gateway.service import Gateway


def build_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="jetlake monitor")

    @app.get("/healthz")
    def healthz(response: Response) -> dict[str, Any]:
        ok = gateway.started and gateway.leaf is not None and gateway.leaf.connected
        if not ok:
            response.status_code = 503
        return {"status": "ok" if ok else "unavailable"}

    return app
