"""The query service (docs/query-service.md): the HTTP API the driver of an application with
keyedstate serves over its running streaming queries, and its Python client."""

from keyedstate.service.client import (
    QueryServiceClient,
    RunningQuery,
    ServiceAddress,
    registry_folder,
    service_address,
)

__all__ = [
    "QueryServiceClient",
    "RunningQuery",
    "ServiceAddress",
    "registry_folder",
    "service_address",
]
