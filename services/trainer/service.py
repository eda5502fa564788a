"""The trainer gRPC service: servicer and serve()."""

from rollway.common.errors import Unimplemented
from rollway.common.server import RollwayServer, ServerConfig
from rollway.trainer.config import TrainerConfig
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc


class TrainerService(trainer_pb2_grpc.TrainerServiceServicer):
    """Placeholder servicer: every RPC answers UNIMPLEMENTED naming the issue that builds it."""

    def Init(self, request, context):
        raise Unimplemented("TrainerService.Init is not implemented yet (issue #4/#5/#7)")

    def ComputeLogProbs(self, request, context):
        raise Unimplemented("TrainerService.ComputeLogProbs is not implemented yet (issue #4/#5/#7)")

    def TrainStep(self, request, context):
        raise Unimplemented("TrainerService.TrainStep is not implemented yet (issue #4/#5/#7)")

    def SaveCheckpoint(self, request, context):
        raise Unimplemented("TrainerService.SaveCheckpoint is not implemented yet (issue #4/#5/#7)")

    def LoadCheckpoint(self, request, context):
        raise Unimplemented("TrainerService.LoadCheckpoint is not implemented yet (issue #4/#5/#7)")

    def InitWeightGroup(self, request, context):
        raise Unimplemented("TrainerService.InitWeightGroup is not implemented yet (issue #4/#5/#7)")

    def PushWeights(self, request, context):
        raise Unimplemented("TrainerService.PushWeights is not implemented yet (issue #4/#5/#7)")

    def WeightChecksum(self, request, context):
        raise Unimplemented("TrainerService.WeightChecksum is not implemented yet (issue #4/#5/#7)")


def serve(server_config: ServerConfig, config: TrainerConfig) -> None:
    """Serve until SIGTERM."""
    server = RollwayServer("trainer", server_config)
    server.add_service(
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        TrainerService(),
        trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
    )
    server.start()
    server.set_serving()
    server.wait_for_termination()
