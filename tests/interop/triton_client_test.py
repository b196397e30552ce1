"""Interop: Triton's own Python HTTP client, and curl, against a real aotid.

Starts `aotid serve` on a fresh store holding the test models (built once,
about 25 s), then drives it with tritonclient.http exactly as a Triton user
would: health, metadata, infer with JSON and with binary tensors, the
repository index, unload and load. Every result is compared with the eager
PyTorch outputs that make_test_models.py recorded.

    triton_client_test.py AOTID_BINARY TESTDATA_DIR
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

AOTID, TESTDATA = sys.argv[1], sys.argv[2]
CASES = json.load(open(os.path.join(TESTDATA, "cases.json")))
DTYPES = {"FP32": np.float32, "INT64": np.int64}


def as_array(tensor):
    return np.array(tensor["data"], dtype=DTYPES[tensor["datatype"]]).reshape(tensor["shape"])


class Daemon:
    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="aotid-interop-")
        self.store = os.path.join(self.dir.name, "store")
        for name in ("mlp", "embed"):
            subprocess.run([AOTID, "--store", self.store, "add", os.path.join(TESTDATA, name + ".pt2"),
                            "--name", name], check=True, stdout=subprocess.DEVNULL)
        self.log_path = os.path.join(self.dir.name, "daemon.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([AOTID, "--store", self.store, "serve", "--listen", "127.0.0.1:0"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        self.port = None
        while self.port is None and time.time() < deadline:
            m = re.search(r"serving on http://[^\s]*:(\d+)", open(self.log_path).read())
            self.port = int(m.group(1)) if m else None
            if self.proc.poll() is not None:
                raise RuntimeError("aotid serve exited:\n" + open(self.log_path).read())
            time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("aotid serve did not report its port:\n" + open(self.log_path).read())
        self.url = f"127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        self.dir.cleanup()


class TritonClientInterop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.client = httpclient.InferenceServerClient(url=cls.daemon.url)
        deadline = time.time() + 900  # two cold compiles on 2 cores
        while time.time() < deadline:
            if all(cls.client.is_model_ready(m) for m in ("mlp", "embed")):
                return
            time.sleep(0.2)
        raise RuntimeError("models not ready:\n" + open(cls.daemon.log_path).read())

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.stop()

    def infer_and_compare(self, model, binary):
        for case in CASES[model]:
            inputs = []
            for t in case["inputs"]:
                i = httpclient.InferInput(t["name"], t["shape"], t["datatype"])
                i.set_data_from_numpy(as_array(t), binary_data=binary)
                inputs.append(i)
            outputs = [httpclient.InferRequestedOutput(t["name"], binary_data=binary) for t in case["outputs"]]
            result = self.client.infer(model, inputs, outputs=outputs, request_id="interop-1")
            self.assertEqual(result.get_response()["model_name"], model)
            self.assertEqual(result.get_response()["id"], "interop-1")
            for want in case["outputs"]:
                got = result.as_numpy(want["name"])
                self.assertIsNotNone(got, want["name"])
                self.assertEqual(list(got.shape), want["shape"])
                np.testing.assert_allclose(got, as_array(want), rtol=1e-5, atol=1e-5)

    def test_health_and_metadata(self):
        self.assertTrue(self.client.is_server_live())
        self.assertTrue(self.client.is_server_ready())
        self.assertEqual(self.client.get_server_metadata()["name"], "aotid")
        meta = self.client.get_model_metadata("mlp")
        self.assertEqual(meta["inputs"], [{"name": "x", "datatype": "FP32", "shape": [-1, 8],
                                           "parameters": {"dynamic_dims": [{"dim": 0, "name": "batch", "min": 1,
                                                                            "max": 65536, "typical": 2}]}}])
        self.assertEqual(meta["outputs"], [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}])
        self.assertEqual(meta["versions"], ["1"])

    def test_infer_json(self):
        self.infer_and_compare("mlp", binary=False)
        self.infer_and_compare("embed", binary=False)

    def test_infer_binary(self):
        self.infer_and_compare("mlp", binary=True)
        self.infer_and_compare("embed", binary=True)

    def test_errors_come_back_as_exceptions_with_the_reason(self):
        i = httpclient.InferInput("x", [1, 7], "FP32")
        i.set_data_from_numpy(np.zeros((1, 7), dtype=np.float32), binary_data=True)
        with self.assertRaises(InferenceServerException) as e:
            self.client.infer("mlp", [i])
        self.assertIn("input 'x' has shape [1, 7], expected [-1, 8]", str(e.exception))
        with self.assertRaises(InferenceServerException) as e:
            self.client.get_model_metadata("nope")
        self.assertIn("unknown model 'nope'", str(e.exception))

    def test_repository_index_unload_load(self):
        index = {(m["name"], m["version"]): m["state"] for m in self.client.get_model_repository_index()}
        self.assertEqual(index, {("mlp", "1"): "READY", ("embed", "1"): "READY"})
        self.client.unload_model("embed")
        self.assertFalse(self.client.is_model_ready("embed"))
        # Triton's sequence: the load returns once the model serves (its
        # build is cached), so the inference right after it is answered.
        self.client.load_model("embed")
        self.infer_and_compare("embed", binary=True)
        self.assertTrue(self.client.is_model_ready("embed"))

    def test_aotid_client_infers_and_verifies_against_eager(self):
        # aotid's own client (aotid_export.client) against the same daemon:
        # binary tensors both ways, INT32 ids widened for an INT64 input,
        # a subset of outputs, and verify() against the eager modules that
        # make_test_models.py exported.
        import torch
        from aotid_export.client import Client, ServerError, VerifyError, verify
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
        from make_test_models import Embed, Mlp

        url = f"http://{self.daemon.url}"
        c = Client(url)
        case = CASES["mlp"][1]
        out = c.infer("mlp", {"x": as_array(case["inputs"][0])})
        self.assertEqual(list(out), ["y"])
        np.testing.assert_allclose(out["y"], as_array(case["outputs"][0]), rtol=1e-5, atol=1e-5)
        # y is [batch, features]: its dim 1 is no position, so last_position
        # is refused (tensor_codec_test cuts a [batch, positions, vocab] one).
        with self.assertRaises(ServerError) as e:
            c.infer("mlp", {"x": as_array(case["inputs"][0])}, outputs=["y"], last_position=["y"])
        self.assertEqual(e.exception.status, 400)
        self.assertIn("of a [batch, positions, ...] output, and 'y' has shape [-1, 4]", e.exception.message)
        ecase = CASES["embed"][0]
        ids32 = torch.from_numpy(as_array(ecase["inputs"][0]).astype(np.int32))
        out = c.infer("embed", {"ids": ids32}, outputs=["pooled"])
        np.testing.assert_allclose(out["pooled"], as_array(ecase["outputs"][0]), rtol=1e-5, atol=1e-5)
        with self.assertRaises(ServerError) as e:
            c.infer("mlp", {"x": as_array(case["inputs"][0])}, outputs=["logits"])
        self.assertEqual(e.exception.status, 400)
        self.assertIn("unknown output 'logits'; the model's outputs are 'y'", e.exception.message)
        with self.assertRaises(ServerError) as e:  # never narrowed
            c.infer("mlp", {"x": as_array(case["inputs"][0]).astype(np.float64)})
        self.assertIn("input 'x' has datatype FP64, expected FP32", e.exception.message)

        mlp = Mlp().eval()
        mlp.load_state_dict(torch.load(os.path.join(TESTDATA, "mlp.state.pt")))
        result = verify(mlp, "mlp", (torch.randn(3, 8),), url=url)
        self.assertTrue(result.ok)
        # The second size grows the dim the metadata names (batch) by one.
        self.assertEqual([k.shapes for k in result.cases], [{"x": [3, 8]}, {"x": [4, 8]}])
        self.assertLess(result.worst()["y"].max_abs, 1e-5)
        embed = Embed().eval()
        embed.load_state_dict(torch.load(os.path.join(TESTDATA, "embed.state.pt")))
        result = verify(embed, "embed", {"ids": ids32}, url=url)  # fixed shape: one size
        self.assertEqual(len(result.cases), 1)
        self.assertLess(result.worst()["pooled"].max_abs, 1e-5)
        self.assertTrue(result.ok)
        torch.manual_seed(7)
        with self.assertRaises(VerifyError) as e:  # other weights: a mismatch, named
            verify(Mlp().eval(), "mlp", (torch.randn(2, 8),), url=url, quiet=True)
        self.assertIn("y (max abs", str(e.exception))
        self.assertFalse(e.exception.result.ok)

    def test_curl(self):
        case = CASES["mlp"][0]
        body = json.dumps({"inputs": case["inputs"]})
        out = subprocess.run(["curl", "-sS", "--fail-with-body", f"http://{self.daemon.url}/v2/models/mlp/infer",
                              "-H", "Content-Type: application/json", "-d", body],
                             check=True, capture_output=True, text=True).stdout
        reply = json.loads(out)
        np.testing.assert_allclose(as_array(reply["outputs"][0]), as_array(case["outputs"][0]), rtol=1e-5, atol=1e-5)
        # Binary through curl: the JSON header, then the raw float32 bytes.
        x = as_array(case["inputs"][0])
        header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                         "parameters": {"binary_data_size": x.nbytes}}]})
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            f.write(header.encode() + x.tobytes())
            f.flush()
            out = subprocess.run(["curl", "-sS", "--fail-with-body", f"http://{self.daemon.url}/v2/models/mlp/infer",
                                  "-H", f"Inference-Header-Content-Length: {len(header)}",
                                  "-H", "Content-Type: application/octet-stream", "--data-binary", "@" + f.name],
                                 check=True, capture_output=True, text=True).stdout
        np.testing.assert_allclose(as_array(json.loads(out)["outputs"][0]), as_array(case["outputs"][0]),
                                   rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
