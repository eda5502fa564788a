"""The dataloader gRPC service: servicer and serve()."""

from rollway.common.errors import Unimplemented
from rollway.common.server import RollwayServer, ServerConfig
from rollway.dataloader.config import DataloaderConfig
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc


class DataloaderService(dataloader_pb2_grpc.DataloaderServiceServicer):
    """Placeholder servicer: every RPC answers UNIMPLEMENTED naming the issue that builds it."""

    def NextBatch(self, request, context):
        raise Unimplemented("DataloaderService.NextBatch is not implemented yet (issue #3)")

    def GetState(self, request, context):
        raise Unimplemented("DataloaderService.GetState is not implemented yet (issue #3)")

    def RestoreState(self, request, context):
        raise Unimplemented("DataloaderService.RestoreState is not implemented yet (issue #3)")

    def Describe(self, request, context):
        raise Unimplemented("DataloaderService.Describe is not implemented yet (issue #3)")


def serve(server_config: ServerConfig, config: DataloaderConfig) -> None:
    """Serve until SIGTERM."""
    server = RollwayServer("dataloader", server_config)
    server.add_service(
        dataloader_pb2_grpc.add_DataloaderServiceServicer_to_server,
        DataloaderService(),
        dataloader_pb2.DESCRIPTOR.services_by_name["DataloaderService"],
    )
    server.start()
    server.set_serving()
    server.wait_for_termination()
