"""KServe's side of tests/interop/grpc_clients_test.py, in a process of its
own: kserve.protocol.grpc and tritonclient.grpc both register the messages
of package `inference` in protobuf's default pool, under other file names,
so one Python process cannot import both (the second import fails with
"duplicate symbol 'inference.ServerLiveRequest'").

    kserve_grpc_client.py descriptor       prints KServe's FileDescriptorProto, base64
    kserve_grpc_client.py calls ADDR CASES TOKEN
                                            KServe's InferenceGRPCClient against a daemon
                                            whose token guards the repository calls
    kserve_grpc_client.py token ADDR TOKEN  the same client against a daemon whose
                                            token guards every call
Exits non-zero with the failed assertion.
"""

import asyncio
import base64
import json
import sys

import grpc
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

NP = {"FP32": np.float32, "INT64": np.int64}


def as_array(tensor):
    return np.array(tensor["data"], dtype=NP[tensor["datatype"]]).reshape(tensor["shape"])


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


async def calls(addr, cases, tok):
    client = InferenceGRPCClient(addr, timeout=30)
    try:
        expect(await client.is_server_live() is True, "server live")
        expect(await client.is_server_ready() is True, "server ready")
        expect(await client.is_model_ready("mlp") is True, "mlp ready")
        # Metadata: the client has no call for it; its stub does.
        meta = await client._client_stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=30)
        expect(meta.name == "aotid", f"server metadata {meta}")
        expect("model_repository" in meta.extensions, f"server metadata {meta}")
        meta = await client._client_stub.ModelMetadata(pb.ModelMetadataRequest(name="two_io"), timeout=30)
        got = [(t.name, t.datatype, list(t.shape)) for t in meta.inputs]
        expect(got == [("x", "FP32", [-1, 6]), ("idx", "INT64", [-1])], f"two_io inputs {got}")
        got = [(t.name, t.datatype, list(t.shape)) for t in meta.outputs]
        expect(got == [("scaled", "FP32", [-1, 6]), ("counts", "INT64", [-1])], f"two_io outputs {got}")
        expect(list(meta.versions) == ["1"] and meta.platform == "aotid_aoti", f"two_io metadata {meta}")
        # numpy data goes as raw contents, binary_data=False as typed
        # contents (fp32_contents, int64_contents). KServe's InferInput has
        # no BF16 (its numpy has none) and FP16 no typed list: alltypes goes
        # through Triton's client.
        n = 0
        for model in ("mlp", "two_io"):
            for case in cases[model]:
                for binary in (True, False):
                    inputs = []
                    for t in case["inputs"]:
                        i = InferInput(t["name"], t["shape"], t["datatype"])
                        i.set_data_from_numpy(as_array(t), binary_data=binary)
                        inputs.append(i)
                    req = InferRequest(model_name=model, infer_inputs=inputs, request_id=f"kserve-{n}")
                    wire = req.to_grpc()
                    expect(len(wire.raw_input_contents) == (len(inputs) if binary else 0), f"{wire}")
                    if not binary:
                        expect(all(i.HasField("contents") for i in wire.inputs), f"{wire}")
                    res = await client.infer(req)
                    expect(res.model_name == model and res.id == f"kserve-{n}", f"{res}")
                    got = {o.name: o.as_numpy() for o in res.outputs}
                    for want in case["outputs"]:
                        g = got[want["name"]].reshape(want["shape"])
                        np.testing.assert_allclose(g, as_array(want), rtol=1e-5, atol=1e-5, err_msg=want["name"])
                    n += 1
        try:
            await client.is_model_ready("nope")
            raise AssertionError("is_model_ready('nope') answered")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.NOT_FOUND, f"unknown model: {e.code()}")
        try:
            bad = InferInput("x", [1, 7], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 7), dtype=np.float32))
            await client.infer(InferRequest(model_name="mlp", infer_inputs=[bad]))
            raise AssertionError("a [1, 7] x answered")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"wrong shape: {e.code()}")
            expect("input 'x' has shape [1, 7], expected [-1, 8]" in e.details(), e.details())
        # KServe's load and unload messages put the model's name in field
        # 1, Triton's repository_name (grpc_clients_test.py compares the
        # files): aotid reads them as Triton's and refuses, unloading
        # nothing.
        auth = (("authorization", "Bearer " + tok),)
        try:
            await client._client_stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="mlp"),
                                                            timeout=30, metadata=auth)
            raise AssertionError("KServe's unload message answered")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.NOT_FOUND, f"KServe's unload: {e.code()}")
            expect("unknown repository 'mlp'" in e.details(), e.details())
        expect(await client.is_model_ready("mlp") is True, "mlp ready after KServe's unload message")
        print(f"kserve: health, metadata and {n} inferences as eager")
    finally:
        await client.close()


async def token(addr, tok):
    client = InferenceGRPCClient(addr, timeout=30)
    try:
        for call in (client.is_server_live(), client.is_server_ready(), client.is_model_ready("mlpb")):
            try:
                await call
                raise AssertionError("answered without the token")
            except grpc.RpcError as e:
                expect(e.code() == grpc.StatusCode.UNAUTHENTICATED, f"no token: {e.code()}")
        try:
            await client.is_server_live(headers=(("authorization", "Bearer wrong"),))
            raise AssertionError("answered with a wrong token")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.PERMISSION_DENIED, f"wrong token: {e.code()}")
        auth = (("authorization", "Bearer " + tok),)
        expect(await client.is_server_live(headers=auth) is True, "live with the token")
        expect(await client.is_model_ready("mlpb", headers=auth) is True, "mlpb ready with the token")
        print("kserve: the token")
    finally:
        await client.close()


def main():
    mode = sys.argv[1]
    if mode == "descriptor":
        print(base64.b64encode(pb.DESCRIPTOR.serialized_pb).decode())
    elif mode == "calls":
        asyncio.run(calls(sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4]))
    elif mode == "token":
        asyncio.run(token(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
