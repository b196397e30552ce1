"""Interop: Triton's and KServe's own gRPC clients against a real aotid.

rpc/oip.proto is compiled to a descriptor set and compared, message by
message and call by call, with the descriptors tritonclient.grpc and
kserve.protocol.grpc were generated from: that is what shows the field
numbers right. Then one store holding the test models is served over gRPC
by two daemons, one after the other (a model is built once, by whichever
first needs it: three builds in all):

- a plain daemon whose token guards the repository calls alone
  (server.token_scope = "repository"): every call of tritonclient.grpc,
  KServe's InferenceGRPCClient, each datatype of alltypes, typed contents
  against raw ones, 16 concurrent clients of a batched model, the error
  codes, and a model added to its store while it runs (UNAVAILABLE while it
  builds);
- the same store under a daemon whose token guards every call, with each
  batched run held 2 s (AOTID_TEST_PAUSE_AT, as tests/e2e/serve_test.cc
  uses it) and a queue of 16: batches that provably join, a full queue
  (RESOURCE_EXHAUSTED), and clients that hang up while their request waits
  (CANCELLED, DEADLINE_EXCEEDED; counted 499 and never run); and gRPC's
  health service answering a probe that has no token.

Every answer is compared with the eager PyTorch outputs in cases.json.

    grpc_clients_test.py AOTID_BINARY TESTDATA_DIR OIP_PROTO PROTOC [TEST...]

KServe's client runs in a process of its own (kserve_grpc_client.py).
"""

import base64
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc
import ml_dtypes
import numpy as np
import tritonclient.grpc as tgrpc
from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2 as triton_pb2
from tritonclient.grpc import service_pb2_grpc as triton_pb2_grpc
from tritonclient.utils import InferenceServerException

AOTID, TESTDATA, OIP_PROTO, PROTOC = sys.argv[1:5]
# KServe's client runs in a process of its own (see kserve_grpc_client.py).
KSERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kserve_grpc_client.py")
CASES = json.load(open(os.path.join(TESTDATA, "cases.json")))
NP = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
      "INT64": np.int64, "FP16": np.float16, "BF16": ml_dtypes.bfloat16, "FP32": np.float32, "FP64": np.float64}
TOKEN = "grpc-interop-token"
AUTH = {"authorization": "Bearer " + TOKEN}
WRONG = {"authorization": "Bearer not-the-token"}
PAUSE_MS = 2000  # each batched run of the second daemon


def as_array(tensor):
    return np.array(tensor["data"], dtype=NP[tensor["datatype"]]).reshape(tensor["shape"])


def assert_equal_to_eager(test, got, want):
    """`got` (a numpy array) against a cases.json tensor: exact for
    integers and BOOL, within float rounding otherwise."""
    test.assertIsNotNone(got, want["name"])
    test.assertEqual(list(got.shape), want["shape"], want["name"])
    if want["datatype"] in ("FP16", "BF16", "FP32", "FP64"):
        np.testing.assert_allclose(got.astype(np.float64), as_array(want).astype(np.float64),
                                   rtol=1e-5, atol=1e-5, err_msg=want["name"])
    else:
        np.testing.assert_array_equal(got, as_array(want), err_msg=want["name"])


def triton_inputs(case):
    inputs = []
    for t in case["inputs"]:
        i = tgrpc.InferInput(t["name"], t["shape"], t["datatype"])
        i.set_data_from_numpy(as_array(t))
        inputs.append(i)
    return inputs


def code_of(e):
    """The gRPC status code tritonclient's exception carries."""
    return e.status()


class Daemon:
    """`aotid serve` on `store` with HTTP and gRPC on free loopback ports."""

    def __init__(self, store, workdir, name, args=(), env=None):
        self.log_path = os.path.join(workdir, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([AOTID, "--store", store, "serve", "--listen", "127.0.0.1:0",
                                      "--grpc-listen", "127.0.0.1:0", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        deadline = time.time() + 60
        self.http = self.grpc = None
        while (self.http is None or self.grpc is None) and time.time() < deadline:
            text = open(self.log_path).read()
            m = re.search(r"serving on http://[^\s]*:(\d+)", text)
            g = re.search(r"gRPC serving on [^\s]*:(\d+)", text)
            self.http = int(m.group(1)) if m else None
            self.grpc = f"127.0.0.1:{g.group(1)}" if g else None
            if self.proc.poll() is not None:
                raise RuntimeError("aotid serve exited:\n" + text)
            time.sleep(0.05)
        if self.http is None or self.grpc is None:
            raise RuntimeError("aotid serve did not report its ports:\n" + open(self.log_path).read())

    def text(self):
        return open(self.log_path).read()

    def metrics(self, headers=None):
        """/metrics as {series: value}."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/metrics", headers=headers or {})
        out = {}
        for line in urllib.request.urlopen(req, timeout=10).read().decode().splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def wait_ready(self, client, models, headers=None, timeout=900):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if all(client.is_model_ready(m, headers=headers) for m in models):
                    return
            except InferenceServerException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"models {models} not ready:\n" + self.text())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


WORK = None
STORE = None


def setUpModule():
    global WORK, STORE
    WORK = tempfile.TemporaryDirectory(prefix="aotid-grpc-interop-")
    STORE = os.path.join(WORK.name, "store")
    # mlpb: mlp again (the same build), batching up to 64 rows. alltypes
    # is added while the first daemon runs. Three builds in all.
    for name, package in (("mlp", "mlp"), ("two_io", "two_io"), ("mlpb", "mlp")):
        subprocess.run([AOTID, "--store", STORE, "add", os.path.join(TESTDATA, package + ".pt2"), "--name", name],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run([AOTID, "--store", STORE, "set", "mlpb", "max_batch_size=64", "max_batch_delay_us=100000"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(WORK.name, "token"), "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(os.path.join(WORK.name, "token"), 0o600)


def tearDownModule():
    WORK.cleanup()


def run_kserve(*args):
    p = subprocess.run([sys.executable, "-W", "ignore", KSERVE, *args], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"kserve_grpc_client.py {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return p.stdout


def write_config(name, text):
    path = os.path.join(WORK.name, name)
    with open(path, "w") as f:
        f.write(text)
    return path


class ProtoMatchesTheClients(unittest.TestCase):
    """rpc/oip.proto against the descriptors the clients' Python code was
    generated from: every message and field that aotid has, and every call."""

    @classmethod
    def setUpClass(cls):
        out = os.path.join(WORK.name, "oip.desc")
        subprocess.run([PROTOC, "-I", os.path.dirname(OIP_PROTO), "--descriptor_set_out=" + out,
                        os.path.basename(OIP_PROTO)], check=True)
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
        cls.ours = fds.file[0]
        cls.triton = descriptor_pb2.FileDescriptorProto.FromString(triton_pb2.DESCRIPTOR.serialized_pb)
        out = run_kserve("descriptor")
        cls.kserve = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(out))

    @staticmethod
    def messages(fdp):
        """{full name: {field name: what the wire and the generated code depend on}}."""
        out = {}

        def walk(prefix, msgs):
            for m in msgs:
                name = prefix + "." + m.name
                oneofs = [o.name for o in m.oneof_decl]
                out[name] = {f.name: (f.number, descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                                      descriptor_pb2.FieldDescriptorProto.Label.Name(f.label), f.type_name,
                                      oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
                                      m.options.map_entry)
                             for f in m.field}
                walk(name, m.nested_type)

        walk("." + fdp.package, fdp.message_type)
        return out

    @staticmethod
    def methods(fdp, service):
        (svc,) = [s for s in fdp.service if s.name == service]
        return {m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in svc.method}

    def test_package_and_service_are_the_clients(self):
        self.assertEqual(self.ours.package, "inference")
        self.assertEqual(self.triton.package, "inference")
        self.assertEqual(self.kserve.package, "inference")
        self.assertEqual([s.name for s in self.ours.service], ["GRPCInferenceService"])

    def test_every_message_and_field_is_tritons(self):
        ours, theirs = self.messages(self.ours), self.messages(self.triton)
        self.assertGreater(len(ours), 20)
        for name, fields in ours.items():
            self.assertIn(name, theirs, f"{name} is not in Triton's grpc_service.proto")
            # Each field as Triton's, and none of Triton's missing (a field
            # aotid lacked would be dropped unseen from what a client sends).
            self.assertEqual(fields, theirs[name], name)

    # KServe's file has the load and unload calls too, with messages of
    # its own under Triton's names: its request's field 1 is model_name,
    # where Triton's (and aotid's) is repository_name. aotid follows
    # Triton; what a KServe stub's call then gets is checked in
    # kserve_grpc_client.py (refused, nothing unloaded).
    KSERVE_REPOSITORY = {
        ".inference.RepositoryModelLoadRequest": {"model_name": (1, "TYPE_STRING")},
        ".inference.RepositoryModelUnloadRequest": {"model_name": (1, "TYPE_STRING")},
        ".inference.RepositoryModelLoadResponse": {"model_name": (1, "TYPE_STRING"), "isLoaded": (2, "TYPE_BOOL")},
        ".inference.RepositoryModelUnloadResponse": {"model_name": (1, "TYPE_STRING"),
                                                      "isUnloaded": (2, "TYPE_BOOL")},
    }

    def test_every_kserve_field_of_a_shared_message_is_ours(self):
        ours, theirs = self.messages(self.ours), self.messages(self.kserve)
        shared = set(ours) & set(theirs) - set(self.KSERVE_REPOSITORY)
        self.assertGreaterEqual(len(shared), 20)
        for name in shared:
            # KServe's InferParameter lacks Triton's double and uint64
            # kinds; every field it has is aotid's.
            for field, spec in theirs[name].items():
                self.assertEqual(ours[name].get(field), spec, f"{name}.{field}")
        for name, fields in self.KSERVE_REPOSITORY.items():
            self.assertEqual({f: spec[:2] for f, spec in theirs[name].items()}, fields, name)
        self.assertEqual(ours[".inference.RepositoryModelLoadRequest"]["repository_name"][:2], (1, "TYPE_STRING"))
        self.assertEqual(ours[".inference.RepositoryModelLoadRequest"]["model_name"][:2], (2, "TYPE_STRING"))
        for name in set(theirs) - set(ours):
            self.fail(f"KServe has {name}, aotid does not")

    def test_every_call_is_tritons_and_kserves(self):
        ours = self.methods(self.ours, "GRPCInferenceService")
        self.assertEqual(set(ours), {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                                     "ModelInfer", "RepositoryIndex", "RepositoryModelLoad",
                                     "RepositoryModelUnload"})
        triton = self.methods(self.triton, "GRPCInferenceService")
        for name, spec in ours.items():
            self.assertEqual(spec, triton.get(name), name)
            self.assertEqual(spec[2:], (False, False), name)  # unary
        kserve = self.methods(self.kserve, "GRPCInferenceService")
        self.assertTrue({"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                         "ModelInfer"} <= set(kserve))
        for name, spec in kserve.items():
            self.assertEqual(ours.get(name), spec, name)


class RepositoryTokenDaemon(unittest.TestCase):
    """The daemon with the token on its repository calls alone."""

    @classmethod
    def setUpClass(cls):
        config = write_config("repository_token.toml",
                              f'[server]\ntoken_file = "{WORK.name}/token"\ntoken_scope = "repository"\n')
        cls.daemon = Daemon(STORE, WORK.name, "daemon1", ["--config", config])
        cls.client = tgrpc.InferenceServerClient(url=cls.daemon.grpc)
        cls.daemon.wait_ready(cls.client, ["mlp", "two_io", "mlpb"])
        cls.channel = grpc.insecure_channel(cls.daemon.grpc)
        cls.stub = triton_pb2_grpc.GRPCInferenceServiceStub(cls.channel)
        # alltypes added to the running daemon's store, and asked for at
        # once (test_unavailable_while_a_model_added_at_run_time_builds).
        subprocess.run([AOTID, "--store", STORE, "add", os.path.join(TESTDATA, "alltypes.pt2"), "--name",
                        "alltypes"], check=True, stdout=subprocess.DEVNULL)
        inputs = triton_inputs(CASES["alltypes"][0])
        deadline = time.time() + 20
        cls.added_seen = cls.added_ready = None
        while time.time() < deadline:
            try:
                cls.client.infer("alltypes", inputs)
                cls.added_seen = ("answered", "")
            except InferenceServerException as e:
                if code_of(e) == "StatusCode.NOT_FOUND":  # the daemon has not seen the commit yet
                    time.sleep(0.005)
                    continue
                cls.added_seen = (code_of(e), e.message())
                cls.added_ready = cls.client.is_model_ready("alltypes")
            break
        cls.daemon.wait_ready(cls.client, ["alltypes"], timeout=600)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.client.close()
        cls.daemon.stop()

    def infer_and_compare(self, model, client=None, request_id=""):
        for case in CASES[model]:
            outputs = [tgrpc.InferRequestedOutput(t["name"]) for t in case["outputs"]]
            result = (client or self.client).infer(model, triton_inputs(case), outputs=outputs,
                                                   request_id=request_id)
            response = result.get_response()
            self.assertEqual(response.model_name, model)
            self.assertEqual(response.model_version, "1")
            self.assertEqual(response.id, request_id)
            self.assertEqual([o.name for o in response.outputs], [t["name"] for t in case["outputs"]])
            for want in case["outputs"]:
                assert_equal_to_eager(self, result.as_numpy(want["name"]), want)

    def assert_code(self, code, fn, *args, has="", **kwargs):
        with self.assertRaises(InferenceServerException) as e:
            fn(*args, **kwargs)
        self.assertEqual(code_of(e.exception), "StatusCode." + code, e.exception.message())
        self.assertIn(has, e.exception.message())
        return e.exception.message()

    def assert_stub_code(self, code, call, request, has="", **kwargs):
        with self.assertRaises(grpc.RpcError) as e:
            call(request, timeout=30, **kwargs)
        self.assertEqual(e.exception.code(), getattr(grpc.StatusCode, code), e.exception.details())
        self.assertIn(has, e.exception.details())

    # Health and metadata.

    def test_health_through_triton(self):
        self.assertTrue(self.client.is_server_live())
        self.assertTrue(self.client.is_server_ready())
        self.assertTrue(self.client.is_model_ready("mlp"))
        self.assertTrue(self.client.is_model_ready("mlp", "1"))
        self.assertTrue(self.client.is_model_ready("alltypes"))

    def test_metadata_through_triton(self):
        server = self.client.get_server_metadata()
        self.assertEqual(server.name, "aotid")
        version = subprocess.run([AOTID, "--version"], capture_output=True, text=True, check=True).stdout
        self.assertTrue(server.version)
        self.assertIn(server.version, version)
        self.assertIn("model_repository", server.extensions)
        self.assertIn("binary_tensor_data", server.extensions)
        meta = self.client.get_model_metadata("mlp")
        self.assertEqual(meta.name, "mlp")
        self.assertEqual(list(meta.versions), ["1"])
        self.assertEqual(meta.platform, "aotid_aoti")
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in meta.inputs], [("x", "FP32", [-1, 8])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in meta.outputs], [("y", "FP32", [-1, 4])])
        meta = self.client.get_model_metadata("alltypes", "1", as_json=True)
        want = [(t["name"], t["datatype"], t["shape"]) for t in CASES["alltypes"][0]["inputs"]]
        self.assertEqual([(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]], want)

    # Inference through Triton's client: raw tensors each way.

    def test_infer_through_triton(self):
        self.infer_and_compare("mlp", request_id="grpc-1")
        self.infer_and_compare("two_io")

    def test_every_datatype_of_alltypes(self):
        # BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64.
        self.assertEqual(len(CASES["alltypes"][0]["inputs"]), 10)
        self.infer_and_compare("alltypes")

    def test_a_subset_of_outputs(self):
        case = CASES["alltypes"][0]
        result = self.client.infer("alltypes", triton_inputs(case),
                                   outputs=[tgrpc.InferRequestedOutput("o_f16"), tgrpc.InferRequestedOutput("o_b")])
        # The two asked for alone (in the model's order).
        self.assertEqual(sorted(o.name for o in result.get_response().outputs), ["o_b", "o_f16"])
        outs = {t["name"]: t for t in case["outputs"]}
        assert_equal_to_eager(self, result.as_numpy("o_f16"), outs["o_f16"])
        assert_equal_to_eager(self, result.as_numpy("o_b"), outs["o_b"])
        self.assertIsNone(result.as_numpy("o_f32"))

    # Typed contents: ModelInferRequest built by hand, sent through the
    # generated stub of tritonclient's own service_pb2_grpc.

    def typed_request(self, model, case, lists):
        req = triton_pb2.ModelInferRequest(model_name=model, id="typed")
        for t in case["inputs"]:
            i = req.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            field = lists[t["datatype"]]
            getattr(i.contents, field).extend(as_array(t).flatten().tolist())
        return req

    def raw_request(self, model, case):
        req = triton_pb2.ModelInferRequest(model_name=model, id="raw")
        for t in case["inputs"]:
            req.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            req.raw_input_contents.append(as_array(t).tobytes())
        return req

    @staticmethod
    def outputs_of(res):
        return {o.name: np.frombuffer(raw, dtype=NP[o.datatype]).reshape(list(o.shape))
                for o, raw in zip(res.outputs, res.raw_output_contents)}

    def test_typed_contents_equal_raw(self):
        lists = {"FP32": "fp32_contents", "INT64": "int64_contents", "BOOL": "bool_contents"}
        for model in ("mlp", "two_io"):
            for case in CASES[model]:
                typed = self.stub.ModelInfer(self.typed_request(model, case, lists), timeout=30)
                raw = self.stub.ModelInfer(self.raw_request(model, case), timeout=30)
                self.assertEqual(typed.id, "typed")
                # The answer is always raw, each output in its own entry.
                self.assertEqual(len(typed.raw_output_contents), len(case["outputs"]))
                self.assertEqual(list(typed.raw_output_contents), list(raw.raw_output_contents))
                got = self.outputs_of(typed)
                for want in case["outputs"]:
                    assert_equal_to_eager(self, got[want["name"]], want)

    def test_typed_contents_of_every_datatype_that_has_them(self):
        # alltypes' FP16 and BF16 have no typed list: the request is refused
        # naming the first of them, after the inputs before it (BOOL in
        # bool_contents, the integers in int/int64/uint_contents) decoded.
        lists = {"BOOL": "bool_contents", "UINT8": "uint_contents", "INT8": "int_contents",
                 "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
                 "FP16": "fp32_contents", "BF16": "fp32_contents", "FP32": "fp32_contents",
                 "FP64": "fp64_contents"}
        req = self.typed_request("alltypes", CASES["alltypes"][0], lists)
        self.assert_stub_code("INVALID_ARGUMENT", self.stub.ModelInfer, req,
                              has="input 'f16': FP16 has no typed contents in the protocol")
        # A BOOL list given for an INT64 input is named, not ignored.
        case = CASES["two_io"][1]
        lists = {"FP32": "fp32_contents", "INT64": "int64_contents"}
        req = self.typed_request("two_io", case, lists)
        req.inputs[1].contents.bool_contents.append(True)
        self.assert_stub_code("INVALID_ARGUMENT", self.stub.ModelInfer, req,
                              has="input 'idx': contents.bool_contents holds elements, but INT64 is read from "
                                  "contents.int64_contents")
        req = self.typed_request("two_io", case, lists)
        del req.inputs[1].contents.int64_contents[-1]
        self.assert_stub_code("INVALID_ARGUMENT", self.stub.ModelInfer, req,
                              has="input 'idx': contents.int64_contents has 6 elements, its shape needs 7")
        # Raw and typed at once: one or the other.
        req = self.typed_request("two_io", case, lists)
        req.raw_input_contents.extend([b"", b""])
        self.assert_stub_code("INVALID_ARGUMENT", self.stub.ModelInfer, req,
                              has="input 'x': has both contents and raw_input_contents; send one")

    def test_bytes_input_is_refused_naming_it(self):
        i = tgrpc.InferInput("x", [1, 8], "BYTES")
        i.set_data_from_numpy(np.array([[b"a"] * 8], dtype=np.object_))
        msg = self.assert_code("INVALID_ARGUMENT", self.client.infer, "mlp", [i], has="'x'")
        self.assertIn("BYTES", msg)

    # KServe's client (asyncio).

    def test_kserve_client(self):
        # Health, metadata, infer raw and typed against eager, NOT_FOUND,
        # INVALID_ARGUMENT (kserve_grpc_client.py asserts each).
        out = run_kserve("calls", self.daemon.grpc, os.path.join(TESTDATA, "cases.json"), TOKEN)
        self.assertIn("kserve: health, metadata and 8 inferences as eager", out)

    # Batching: 16 clients at once, each its own rows.

    def test_sixteen_concurrent_clients_of_a_batched_model(self):
        rows = CASES["mlp_rows"]
        errors = []
        start = threading.Barrier(16)

        def client_thread(k):
            try:
                c = tgrpc.InferenceServerClient(url=self.daemon.grpc)
                start.wait()
                for case in (rows[k], rows[k + 16]):
                    result = c.infer("mlpb", triton_inputs(case))
                    assert_equal_to_eager(self, result.as_numpy("y"), case["outputs"][0])
                c.close()
            except Exception as e:  # noqa: BLE001 -- reported below
                errors.append(f"client {k}: {e!r}")

        threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])

    # Error codes.

    def test_not_found(self):
        self.assert_code("NOT_FOUND", self.client.infer, "nope", triton_inputs(CASES["mlp"][0]),
                         has="unknown model 'nope'")
        self.assert_code("NOT_FOUND", self.client.get_model_metadata, "nope", has="unknown model 'nope'")
        self.assert_code("NOT_FOUND", self.client.is_model_ready, "nope")
        self.assert_code("NOT_FOUND", self.client.infer, "mlp", triton_inputs(CASES["mlp"][0]), model_version="7",
                         has="model 'mlp' has no served version 7 (serving: 1)")
        self.assert_code("NOT_FOUND", self.client.get_model_metadata, "mlp", "7", has="no served version 7")

    def test_wrong_shape_names_the_input(self):
        i = tgrpc.InferInput("x", [1, 7], "FP32")
        i.set_data_from_numpy(np.zeros((1, 7), dtype=np.float32))
        # The words of HTTP's answer (tests/interop/triton_client_test.py).
        self.assert_code("INVALID_ARGUMENT", self.client.infer, "mlp", [i],
                         has="input 'x' has shape [1, 7], expected [-1, 8]")
        i = tgrpc.InferInput("x", [1, 8], "FP64")
        i.set_data_from_numpy(np.zeros((1, 8), dtype=np.float64))
        self.assert_code("INVALID_ARGUMENT", self.client.infer, "mlp", [i],
                         has="input 'x' has datatype FP64, expected FP32")

    def test_repository_calls_need_the_token(self):
        # token_scope = "repository": the other calls go without it (every
        # other test here), these three not.
        for call, args in ((self.client.get_model_repository_index, ()), (self.client.load_model, ("two_io",)),
                           (self.client.unload_model, ("two_io",))):
            self.assert_code("UNAUTHENTICATED", call, *args, has="authorization: Bearer")
            self.assert_code("PERMISSION_DENIED", call, *args, headers=WRONG, has="wrong bearer token")
        self.assertTrue(self.client.is_model_ready("two_io"))  # neither refused call unloaded it
        index = self.client.get_model_repository_index(headers=AUTH)
        states = {(m.name, m.version): m.state for m in index.models}
        for name in ("mlp", "two_io", "alltypes", "mlpb"):
            self.assertEqual(states.get((name, "1")), "READY", name)

    def test_unload_and_load(self):
        self.client.unload_model("two_io", headers=AUTH)
        # Not ready (as HTTP's 503), not an error: tritonclient would raise.
        self.assertFalse(self.client.is_model_ready("two_io"))
        self.assert_code("UNAVAILABLE", self.client.infer, "two_io", triton_inputs(CASES["two_io"][0]),
                         has="model 'two_io' is unloaded")
        index = {m.name: (m.state, m.reason) for m in self.client.get_model_repository_index(headers=AUTH).models}
        self.assertEqual(index["two_io"], ("UNAVAILABLE", "unloaded"))
        ready_only = self.stub.RepositoryIndex(triton_pb2.RepositoryIndexRequest(ready=True), timeout=30,
                                               metadata=tuple(AUTH.items()))
        self.assertEqual(sorted(m.name for m in ready_only.models), ["alltypes", "mlp", "mlpb"])
        # The load returns once the model serves (its build is cached): the
        # inference right after it is answered, as Triton's clients expect.
        self.client.load_model("two_io", headers=AUTH)
        self.infer_and_compare("two_io")
        self.assertTrue(self.client.is_model_ready("two_io"))
        req = triton_pb2.RepositoryModelLoadRequest(repository_name="elsewhere", model_name="two_io")
        self.assert_stub_code("NOT_FOUND", self.stub.RepositoryModelLoad, req, metadata=tuple(AUTH.items()),
                              has="unknown repository 'elsewhere'")

    def test_unavailable_while_a_model_added_at_run_time_builds(self):
        # setUpClass added alltypes to the running daemon's store and asked
        # at once: from the moment the daemon knew it, UNAVAILABLE while it
        # built (seconds), not ready; then it answers (the datatype tests).
        self.assertIsNotNone(self.added_seen, "the daemon did not notice the added model in 20 s")
        self.assertEqual(self.added_seen[0], "StatusCode.UNAVAILABLE", self.added_seen)
        self.assertRegex(self.added_seen[1], r"model 'alltypes' version 1 is (queued for its build|building|loading)")
        self.assertIs(self.added_ready, False)
        self.assertTrue(self.client.is_model_ready("alltypes"))


class AllCallsTokenSlowRunsDaemon(unittest.TestCase):
    """The same store under a daemon whose token guards every call, whose
    batched runs are held PAUSE_MS each, with a queue of 16 per model."""

    @classmethod
    def setUpClass(cls):
        config = write_config("all_token.toml", f'[server]\ntoken_file = "{WORK.name}/token"\n'
                                                'token_scope = "all"\nmax_queued_requests = 16\n')
        cls.daemon = Daemon(STORE, WORK.name, "daemon2", ["--config", config],
                            env={"AOTID_TEST_PAUSE_AT": f"batch_run={PAUSE_MS}"})
        cls.client = tgrpc.InferenceServerClient(url=cls.daemon.grpc)
        cls.daemon.wait_ready(cls.client, ["mlpb"], headers=AUTH)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.stop()

    def series(self, metrics, family, code=None):
        key = family + '{model="mlpb",version="1"' + (f',code="{code}"' if code else "") + "}"
        return metrics.get(key, 0.0)

    def test_every_call_needs_the_token(self):
        with self.assertRaises(InferenceServerException) as e:
            self.client.is_server_live()
        self.assertEqual(code_of(e.exception), "StatusCode.UNAUTHENTICATED")
        with self.assertRaises(InferenceServerException) as e:
            self.client.infer("mlpb", triton_inputs(CASES["mlp_rows"][0]), headers=WRONG)
        self.assertEqual(code_of(e.exception), "StatusCode.PERMISSION_DENIED")
        with self.assertRaises(InferenceServerException) as e:
            self.client.get_model_metadata("mlpb")
        self.assertEqual(code_of(e.exception), "StatusCode.UNAUTHENTICATED")

        self.assertIn("kserve: the token", run_kserve("token", self.daemon.grpc, TOKEN))
        self.assertTrue(self.client.is_server_live(headers=AUTH))
        self.assertEqual(self.client.get_server_metadata(headers=AUTH).name, "aotid")

    def test_the_health_service_answers_a_probe_without_the_token(self):
        # grpc.health.v1.Health over grpcio, as a probe sends it: the request
        # is {1: service}, the answer {1: status}, 1 SERVING.
        def request(service):
            data = service.encode()
            return (b"\x0a" + bytes([len(data)]) + data) if data else b""

        with grpc.insecure_channel(self.daemon.grpc) as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            # Not ready (NOT_SERVING) while a model of the store builds; the
            # health service reads readiness once a second.
            deadline = time.time() + 900
            while not self.client.is_server_ready(headers=AUTH):
                self.assertEqual(check(request("live"), timeout=30), b"\x08\x01")
                self.assertLess(time.time(), deadline, self.daemon.text())
                time.sleep(0.2)
            deadline = time.time() + 5
            while check(request(""), timeout=30) != b"\x08\x01" and time.time() < deadline:
                time.sleep(0.05)
            for service in ("", "ready", "live", "inference.GRPCInferenceService"):
                self.assertEqual(check(request(service), timeout=30), b"\x08\x01", service)
            with self.assertRaises(grpc.RpcError) as e:
                check(request("inference.NoSuchService"), timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch")(request(""), timeout=30)
            self.assertEqual(next(watch), b"\x08\x01")
            watch.cancel()

    def fire(self, n, first_row=0):
        """n requests at once on one connection; [(row, result, error)]."""
        done = queue.Queue()
        rows = CASES["mlp_rows"]
        for k in range(n):
            case = rows[(first_row + k) % len(rows)]
            self.client.async_infer("mlpb", triton_inputs(case), headers=AUTH, client_timeout=60,
                                    callback=lambda result, error, case=case: done.put((case, result, error)))
        return [done.get(timeout=90) for _ in range(n)]

    def test_batches_join_and_each_client_gets_its_rows(self):
        before = self.daemon.metrics(AUTH)
        out = self.fire(16)
        for case, result, error in out:
            self.assertIsNone(error)
            assert_equal_to_eager(self, result.as_numpy("y"), case["outputs"][0])
        after = self.daemon.metrics(AUTH)
        runs = self.series(after, "aotid_batch_rows_count") - self.series(before, "aotid_batch_rows_count")
        rows = self.series(after, "aotid_batch_rows_sum") - self.series(before, "aotid_batch_rows_sum")
        self.assertEqual(rows, 16)
        # Each run is held 2 s: the requests that came meanwhile joined.
        self.assertLessEqual(runs, 3, (runs, rows))

    def test_a_full_queue_is_resource_exhausted(self):
        before = self.daemon.metrics(AUTH)
        out = self.fire(40)
        ok = [(case, result) for case, result, error in out if error is None]
        full = [error for case, result, error in out if error is not None]
        for case, result in ok:
            assert_equal_to_eager(self, result.as_numpy("y"), case["outputs"][0])
        for error in full:
            self.assertEqual(code_of(error), "StatusCode.RESOURCE_EXHAUSTED", error.message())
            self.assertIn("the model's queue is full", error.message())
        # At most 16 wait while a run is held, and a run takes all of them.
        self.assertGreaterEqual(len(full), 40 - 2 * 16 - 1)
        self.assertGreaterEqual(len(ok), 16)
        after = self.daemon.metrics(AUTH)
        self.assertEqual(self.series(after, "aotid_batch_rows_sum") - self.series(before, "aotid_batch_rows_sum"),
                         len(ok))
        # The daemon answers on.
        result = self.client.infer("mlpb", triton_inputs(CASES["mlp_rows"][3]), headers=AUTH)
        assert_equal_to_eager(self, result.as_numpy("y"), CASES["mlp_rows"][3]["outputs"][0])

    def test_a_client_that_hangs_up_while_waiting_is_not_run(self):
        rows = CASES["mlp_rows"]
        before = self.daemon.metrics(AUTH)
        inflight = before.get("aotid_inflight_requests", 0)
        done = queue.Queue()
        # The request ahead: its run is held PAUSE_MS.
        self.client.async_infer("mlpb", triton_inputs(rows[5]), headers=AUTH,
                                callback=lambda result, error: done.put((result, error)))

        def wait_inflight(n):
            deadline = time.time() + 10
            while time.time() < deadline:
                if self.daemon.metrics(AUTH).get("aotid_inflight_requests", 0) >= inflight + n:
                    return
                time.sleep(0.02)
            self.fail(f"{n} requests were not in flight")

        wait_inflight(1)
        # One whose deadline passes while it waits behind it...
        timed_out = queue.Queue()
        self.client.async_infer("mlpb", triton_inputs(rows[6]), headers=AUTH, client_timeout=0.8,
                                callback=lambda result, error: timed_out.put((result, error)))
        # ... and one its client cancels.
        cancelled = queue.Queue()
        call = self.client.async_infer("mlpb", triton_inputs(rows[7]), headers=AUTH,
                                       callback=lambda result, error: cancelled.put((result, error)))
        wait_inflight(3)
        call.cancel()
        result, error = cancelled.get(timeout=10)
        self.assertIsNotNone(error)
        self.assertEqual(code_of(error), "StatusCode.CANCELLED")
        result, error = timed_out.get(timeout=10)
        self.assertIsNotNone(error)
        self.assertEqual(code_of(error), "StatusCode.DEADLINE_EXCEEDED")
        result, error = done.get(timeout=30)
        self.assertIsNone(error)
        assert_equal_to_eager(self, result.as_numpy("y"), rows[5]["outputs"][0])

        # Both counted 499 when the batcher dropped them, and neither run:
        # the one row run was the request ahead.
        deadline = time.time() + 10
        while time.time() < deadline:
            after = self.daemon.metrics(AUTH)
            if self.series(after, "aotid_inference_requests_total", 499) - \
                    self.series(before, "aotid_inference_requests_total", 499) >= 2:
                break
            time.sleep(0.05)
        gone = self.series(after, "aotid_inference_requests_total", 499) - \
            self.series(before, "aotid_inference_requests_total", 499)
        self.assertEqual(gone, 2, self.daemon.text()[-3000:])
        self.assertEqual(self.series(after, "aotid_inference_requests_total", 200) -
                         self.series(before, "aotid_inference_requests_total", 200), 1)
        self.assertEqual(self.series(after, "aotid_batch_rows_sum") - self.series(before, "aotid_batch_rows_sum"), 1)
        self.assertEqual(after.get("aotid_inflight_requests"), inflight)
        # And the daemon answers on.
        result = self.client.infer("mlpb", triton_inputs(rows[8]), headers=AUTH)
        assert_equal_to_eager(self, result.as_numpy("y"), rows[8]["outputs"][0])


class ReadmeExample(unittest.TestCase):
    """The README's gRPC example as written, against the demo model that
    `./dev run` serves: its serve command (the port swapped for a free one;
    the store and the HTTP port the test's own, through AOTID_CONFIG), then
    its Python lines, whose printed answer must be eager PyTorch's."""

    def test_readme_example_answers_as_eager(self):
        root, torch_py = os.environ["AOTID_SOURCE_DIR"], os.environ["AOTID_TORCH_PYTHON"]
        sys.path.insert(0, os.path.join(root, "tests", "docs"))
        import example_claims
        test = "interop.GrpcClients"
        serve, = example_claims.block(test, "README.md", "aotid serve --grpc-listen 127.0.0.1:8766").commands
        code, = example_claims.block(test, "README.md", 'grpcclient.InferenceServerClient("127.0.0.1:8766")').commands
        work = tempfile.mkdtemp(prefix="aotid-grpc-readme-")
        self.addCleanup(shutil.rmtree, work, ignore_errors=True)
        env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
        demo = os.path.join(work, "demo.pt2")
        subprocess.run([torch_py, "-W", "ignore", "-m", "aotid_export", "aotid_export.demo:make_model",
                        "--input", "features=float32[1,4]", "--output-name", "probabilities", "--dynamic-batch",
                        "-o", demo], check=True, env=env, stdout=subprocess.DEVNULL)
        eager = json.loads(subprocess.run(
            [torch_py, "-c", "import json, torch; from aotid_export.demo import make_model; "
             "print(json.dumps(make_model()(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).tolist()))"],
            check=True, env=env, capture_output=True, text=True).stdout)
        store = os.path.join(work, "store")
        subprocess.run([AOTID, "--store", store, "add", demo, "--name", "demo"], check=True,
                       stdout=subprocess.DEVNULL)
        config = os.path.join(work, "aotid.toml")
        with open(config, "w") as f:
            f.write(f'[store]\npath = "{store}"\n[server]\nlisten = "127.0.0.1:0"\n')
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        argv = serve.text.replace("8766", port).split()
        self.assertEqual(argv[0], "aotid")
        log = open(os.path.join(work, "serve.log"), "w")
        proc = subprocess.Popen([AOTID, *argv[1:]], stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, AOTID_CONFIG=config))
        try:
            client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
            deadline = time.time() + 900  # the demo's first build
            while time.time() < deadline:
                self.assertIsNone(proc.poll(), open(log.name).read())
                try:
                    if client.is_model_ready("demo"):
                        break
                except InferenceServerException:
                    pass  # not listening yet
                time.sleep(0.2)
            printed = subprocess.run([sys.executable, "-W", "ignore", "-c", code.text.replace("8766", port)],
                                     check=True, capture_output=True, text=True).stdout
            got = [float(v) for v in re.findall(r"[-+]?\d*\.\d+(?:[eE][-+]?\d+)?|[-+]?\d+(?:[eE][-+]?\d+)?",
                                                printed)]
            np.testing.assert_allclose(got, np.array(eager).ravel(), rtol=1e-4, atol=1e-6, err_msg=printed)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[5:]])  # more: the tests to run
