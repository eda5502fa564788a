"""Server reflection over both protocol versions, serving the .proto comments as documentation.

    enable_reflection(server, ["rollway.trainer.v1.TrainerService", "grpc.health.v1.Health"])

grpc.reflection.v1 and grpc.reflection.v1alpha are the same protocol under two package names
(the messages are identical on the wire), so one servicer answers both. grpcio-reflection ships
only v1alpha, and its servicer rebuilds each file from the compiled-in descriptors, which drop
the comments. Here rollway's files are served as protoc wrote them (descriptors.binpb, written
by protos/generate.py with --include_source_info): a client sees each RPC's documentation in
`source_code_info`. Files outside that set (grpc.health.v1, the reflection protos) come from the
compiled-in descriptors, without comments. The google.rpc types of rich errors (Status, BadRequest,
PreconditionFailure: common/interceptors.py) are served too, so that a reflection client such as
`buf curl` decodes an error's details instead of printing them as base64.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.rpc import error_details_pb2, status_pb2
from grpc_reflection.v1alpha import reflection_pb2 as pb

DESCRIPTOR_SET = Path(__file__).resolve().parent / "v1" / "descriptors.binpb"
V1ALPHA_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
SERVICE_NAMES = (V1_SERVICE, V1ALPHA_SERVICE)


class _Files:
    """FileDescriptorProtos by file name (with comments where known) and a pool to find symbols in."""

    def __init__(self) -> None:
        self.protos: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        self.pool = descriptor_pool.DescriptorPool()
        try:
            descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{DESCRIPTOR_SET} is missing: run `make proto` (server reflection serves it)"
            ) from None
        for proto in descriptor_set.file:  # protoc writes them dependencies first
            self._add(proto)
        self._add_compiled(pb.DESCRIPTOR)
        self._add(_v1_reflection_file())
        self._add_compiled(status_pb2.DESCRIPTOR)  # the details of an error (interceptors.py)
        self._add_compiled(error_details_pb2.DESCRIPTOR)

    def _add(self, proto: descriptor_pb2.FileDescriptorProto) -> None:
        if proto.name not in self.protos:
            self.pool.Add(proto)
            self.protos[proto.name] = proto

    def _add_compiled(self, file_descriptor) -> None:
        """A file of the default pool (and its imports), as compiled in: no comments."""
        for dependency in file_descriptor.dependencies:
            self._add_compiled(dependency)
        if file_descriptor.name not in self.protos:
            proto = descriptor_pb2.FileDescriptorProto()
            file_descriptor.CopyToProto(proto)
            self._add(proto)

    def add_symbol(self, symbol: str) -> None:
        """Make the file declaring `symbol` (a served service) known, if the default pool has it."""
        try:
            self.pool.FindFileContainingSymbol(symbol)
        except KeyError:
            try:
                self._add_compiled(descriptor_pool.Default().FindFileContainingSymbol(symbol))
            except KeyError:
                pass  # a service registered without a descriptor: listed, not described

    def with_dependencies(self, name: str) -> list[bytes]:
        """The serialized file `name` followed by every file it imports, transitively."""
        seen: dict[str, bytes] = {}
        pending = [name]
        while pending:
            current = pending.pop()
            if current not in seen:
                seen[current] = self.protos[current].SerializeToString()
                pending.extend(self.protos[current].dependency)
        return list(seen.values())


@functools.cache
def _files() -> _Files:
    return _Files()


def _v1_reflection_file() -> descriptor_pb2.FileDescriptorProto:
    """grpc/reflection/v1/reflection.proto, derived from v1alpha's (only the package differs)."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = "grpc.reflection.v1"
    proto.ClearField("options")
    for message in proto.message_type:
        for field in message.field:
            if field.type_name:
                field.type_name = field.type_name.replace(old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    return proto


class ReflectionServicer:
    """Answers ServerReflectionInfo for the services in `service_names`."""

    def __init__(self, service_names: Iterable[str]):
        self.service_names = sorted(set(service_names))
        self.files = _files()
        for name in self.service_names:
            self.files.add_symbol(name)

    def ServerReflectionInfo(self, requests, context):  # noqa: N802 (the gRPC method name)
        for request in requests:
            yield self._answer(request)

    def _answer(self, request: pb.ServerReflectionRequest) -> pb.ServerReflectionResponse:
        kind = request.WhichOneof("message_request")
        try:
            if kind == "list_services":
                services = [pb.ServiceResponse(name=name) for name in self.service_names]
                return pb.ServerReflectionResponse(
                    original_request=request, list_services_response=pb.ListServiceResponse(service=services)
                )
            if kind == "file_by_filename":
                return self._files_response(request, request.file_by_filename)
            if kind == "file_containing_symbol":
                return self._files_response(request, self._file_of(request.file_containing_symbol))
            if kind == "file_containing_extension":
                ext = request.file_containing_extension
                message = self.files.pool.FindMessageTypeByName(ext.containing_type)
                extension = self.files.pool.FindExtensionByNumber(message, ext.extension_number)
                return self._files_response(request, extension.file.name)
            if kind == "all_extension_numbers_of_type":
                message = self.files.pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = sorted(e.number for e in self.files.pool.FindAllExtensions(message))
                return pb.ServerReflectionResponse(
                    original_request=request,
                    all_extension_numbers_response=pb.ExtensionNumberResponse(
                        base_type_name=message.full_name, extension_number=numbers
                    ),
                )
        except KeyError as exc:
            return _error(request, grpc.StatusCode.NOT_FOUND, f"not found: {exc}")
        return _error(request, grpc.StatusCode.INVALID_ARGUMENT, f"unsupported request: {kind}")

    def _file_of(self, symbol: str) -> str:
        """The file declaring `symbol`: a service, message, enum, field ... or a method
        (Service.Method, what `grpcurl describe` asks for), which the pool does not look up."""
        try:
            return self.files.pool.FindFileContainingSymbol(symbol).name
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            try:
                service = self.files.pool.FindServiceByName(service_name)
            except KeyError:
                service = None
            if service is None or method not in service.methods_by_name:
                raise KeyError(symbol) from None  # NOT_FOUND naming the symbol asked for
            return service.file.name

    def _files_response(self, request, name: str) -> pb.ServerReflectionResponse:
        if name not in self.files.protos:
            raise KeyError(name)
        return pb.ServerReflectionResponse(
            original_request=request,
            file_descriptor_response=pb.FileDescriptorResponse(
                file_descriptor_proto=self.files.with_dependencies(name)
            ),
        )


def _error(request, code: grpc.StatusCode, message: str) -> pb.ServerReflectionResponse:
    return pb.ServerReflectionResponse(
        original_request=request,
        error_response=pb.ErrorResponse(error_code=code.value[0], error_message=message),
    )


def enable_reflection(server: grpc.Server, service_names: Iterable[str]) -> None:
    """Serve grpc.reflection.v1 and v1alpha on `server`, listing `service_names` (and themselves)."""
    servicer = ReflectionServicer([*service_names, *SERVICE_NAMES])
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=pb.ServerReflectionRequest.FromString,
        response_serializer=pb.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler})
            for name in SERVICE_NAMES
        ]
    )
