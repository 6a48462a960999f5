"""The standard gRPC health service (--enable_grpc_healthcheck_service).

As in server.cc: the services "ModelService" and "PredictionService" (and the overall server,
"") report SERVING from the moment the gRPC server starts, with no model check; any other
service name is NOT_FOUND.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from .grpc_service import RESOURCE_EXHAUSTED_MESSAGE, ThreadQuota, with_quota
from .protos import message_class

SERVING = 1
SERVICES = ("", "ModelService", "PredictionService")


def _request_class() -> Any:
    return message_class("grpc.health.v1.HealthCheckRequest")


def _response_class() -> Any:
    return message_class("grpc.health.v1.HealthCheckResponse")


class _Health:
    """Check and Watch, each holding one of the server's gRPC threads while it runs."""

    def __init__(self, quota: ThreadQuota) -> None:
        self.quota = quota

    @with_quota
    async def check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, "service name unknown")
        return _response_class()(status=SERVING)

    async def watch(self, request: Any, context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[Any]:
        if not self.quota.enter():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RESOURCE_EXHAUSTED_MESSAGE)
        try:
            status = SERVING if request.service in SERVICES else 3  # SERVICE_UNKNOWN
            yield _response_class()(status=status)
            await asyncio.Event().wait()  # statuses never change; ends when the client leaves
        finally:
            self.quota.leave()


def handler(quota: ThreadQuota) -> grpc.GenericRpcHandler:
    """The grpc.health.v1.Health service as a generic handler (for grpc.aio)."""
    request = _request_class()
    health = _Health(quota)
    methods = {
        "Check": grpc.unary_unary_rpc_method_handler(
            health.check, request_deserializer=request.FromString,
            response_serializer=lambda m: m.SerializeToString()),
        "Watch": grpc.unary_stream_rpc_method_handler(
            health.watch, request_deserializer=request.FromString,
            response_serializer=lambda m: m.SerializeToString()),
    }
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", methods)
