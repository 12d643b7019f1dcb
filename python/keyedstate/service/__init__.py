"""The query service (docs/query-service.md): the HTTP API the driver of an application with
keyedstate serves over its running streaming queries, and its Python clients: the service's,
and queryable state's (docs/queryable-state.md)."""

from keyedstate.service.client import (
    QueryServiceClient,
    RunningQuery,
    ServiceAddress,
    registry_folder,
    service_address,
)
from keyedstate.service.queryable import (
    PartitionBehind,
    QueryableStateClient,
    QueryableStateInfo,
    StaleStateWarning,
    StateLookup,
)

__all__ = [
    "PartitionBehind",
    "QueryServiceClient",
    "QueryableStateClient",
    "QueryableStateInfo",
    "StaleStateWarning",
    "StateLookup",
    "RunningQuery",
    "ServiceAddress",
    "registry_folder",
    "service_address",
]
