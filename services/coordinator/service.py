"""The coordinator gRPC service: servicer and serve()."""

from rollway.common.errors import Unimplemented
from rollway.common.server import RollwayServer, ServerConfig
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """Placeholder servicer: every RPC answers UNIMPLEMENTED naming the issue that builds it."""

    def StartRun(self, request, context):
        raise Unimplemented("CoordinatorService.StartRun is not implemented yet (issue #8)")

    def GetRun(self, request, context):
        raise Unimplemented("CoordinatorService.GetRun is not implemented yet (issue #8)")

    def StreamMetrics(self, request, context):
        raise Unimplemented("CoordinatorService.StreamMetrics is not implemented yet (issue #8)")

    def StopRun(self, request, context):
        raise Unimplemented("CoordinatorService.StopRun is not implemented yet (issue #8)")

    def ListRuns(self, request, context):
        raise Unimplemented("CoordinatorService.ListRuns is not implemented yet (issue #8)")


def serve(server_config: ServerConfig, config: CoordinatorConfig) -> None:
    """Serve until SIGTERM."""
    server = RollwayServer("coordinator", server_config)
    server.add_service(
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
        CoordinatorService(),
        coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"],
    )
    server.start()
    server.set_serving()
    server.wait_for_termination()
