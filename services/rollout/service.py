"""The rollout gRPC service: servicer and serve()."""

from rollway.common.errors import Unimplemented
from rollway.common.server import RollwayServer, ServerConfig
from rollway.rollout.config import RolloutConfig
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc


class RolloutService(rollout_pb2_grpc.RolloutServiceServicer):
    """Placeholder servicer: every RPC answers UNIMPLEMENTED naming the issue that builds it."""

    def Generate(self, request, context):
        raise Unimplemented("RolloutService.Generate is not implemented yet (issue #6/#7)")

    def InitWeightGroup(self, request, context):
        raise Unimplemented("RolloutService.InitWeightGroup is not implemented yet (issue #6/#7)")

    def UpdateWeights(self, request, context):
        raise Unimplemented("RolloutService.UpdateWeights is not implemented yet (issue #6/#7)")

    def Pause(self, request, context):
        raise Unimplemented("RolloutService.Pause is not implemented yet (issue #6/#7)")

    def Resume(self, request, context):
        raise Unimplemented("RolloutService.Resume is not implemented yet (issue #6/#7)")

    def ReleaseMemory(self, request, context):
        raise Unimplemented("RolloutService.ReleaseMemory is not implemented yet (issue #6/#7)")

    def ResumeMemory(self, request, context):
        raise Unimplemented("RolloutService.ResumeMemory is not implemented yet (issue #6/#7)")

    def WeightChecksum(self, request, context):
        raise Unimplemented("RolloutService.WeightChecksum is not implemented yet (issue #6/#7)")

    def GetInfo(self, request, context):
        raise Unimplemented("RolloutService.GetInfo is not implemented yet (issue #6/#7)")


def serve(server_config: ServerConfig, config: RolloutConfig) -> None:
    """Serve until SIGTERM."""
    server = RollwayServer("rollout", server_config)
    server.add_service(
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        RolloutService(),
        rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
    )
    server.start()
    server.set_serving()
    server.wait_for_termination()
