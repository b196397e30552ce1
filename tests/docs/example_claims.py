"""Which test runs each example of the docs, and why the others are not run.

A block is named by its file and a piece of its text found in no other
block of that file. Every block that holds a command (tests/docs/
doc_examples.py) is in RUN or in NOT_RUN, never both, and each name finds
exactly one block: tests/docs/claims_test.py (docs.EveryExampleRunOrExcused)
checks it, so a new example that no test runs fails, and so does a claim on
an example that changed or went. A test takes its blocks through block(),
which refuses a block the registry does not give it.
"""

import os

import doc_examples

HERE = os.path.dirname(os.path.abspath(__file__))

# ctest name: (the test's source, relative to tests/, [(doc, piece of the block)]).
RUN = {
    "docs.ExamplesRunAsWritten": ("docs/examples_test.py", [
        ("README.md", "curl -s localhost:8765/v2/models/demo/infer"),
        ("README.md", "mypkg.models:make_model"),
        ("docs/SYNC.md", "[[sync]]"),
    ]),
    "llm.SmolLM2GreedyEqualsEager": ("llm/smollm2_test.py", [
        ("README.md", "examples/smollm2/export.py smollm2.pt2"),
        ("README.md", "localhost:8765/v1/chat/completions"),
        ("docs/OPENAI.md", "localhost:8765/v1/chat/completions"),
        ("docs/OPENAI.md", "client.chat.completions.create("),
    ]),
    "interop.GrpcClients": ("interop/grpc_clients_test.py", [
        ("README.md", "aotid serve --grpc-listen 127.0.0.1:8766"),
        ("README.md", 'grpcclient.InferenceServerClient("127.0.0.1:8766")'),
    ]),
    "llm.MiniLmServedEqualsSentenceTransformers": ("llm/minilm_test.py", [
        ("examples/minilm/README.md", "python examples/minilm/export.py minilm.pt2"),
        ("examples/minilm/README.md", "client.embeddings.create("),
    ]),
}

# (doc, piece of the block, the digest of its commands, why no test runs it
# as written). The digest (doc_examples.Block.digest) changes with the
# commands, so an excused block that gains or changes a command fails the
# check until someone has run it in a test or seen that the reason holds.
NOT_RUN = [
    ("README.md", "./dev test", "1c1a6c64", "./dev run serves until stopped and ./dev test is this suite; "
     "docs.ExamplesRunAsWritten starts scripts/run-default.sh, what ./dev run runs once it has built"),
    ("README.md", "~/.local/aotid/bin/aotid service install --user", "c3bcaa43",
     "installs into the home directory and enables a user service; "
     "install.WheelRunsFromAFreshVenvWithoutTheCheckout does the same in a venv and a systemd of its own"),
    ("README.md", "sudo /usr/bin/python3 -m venv /opt/aotid", "5df28cc3",
     "root, /opt and the machine's systemd; the wheel test installs the system service's files with --dry-run"),
    ("README.md", "aotid_export.export(model, (torch.randn(1, 8),)", "8d377733",
     "a fragment: `model` is the reader's module"),
    ("README.md", 'aotid_export.export(bert, {"input_ids": ids', "e598c7a1",
     "a fragment: `bert`, `ids` and `mask` are the reader's"),
    ("README.md", "from aotid_export.client import Client, verify", "f6a9672c",
     "a fragment: `model`, `lm` and `ids` are the reader's"),
    ("docs/EMBEDDINGS.md", "aotid-export hf FOLDER", "a62cdacb", "a synopsis: FOLDER is the reader's"),
    ("docs/EMBEDDINGS.md", "export_sentence_encoder(bert,", "1a8cb6b7", "a fragment: `bert` is the reader's"),
    ("docs/GENERATE.md", "from aotid_export.llm import Llama, LlamaConfig", "0ef6e7bb",
     "a fragment: the weights, `tok` and `template` are the reader's"),
    ("docs/GENERATE.md", "[--max-seq-len 2048]", "4e859e42", "a synopsis: ./my-llama is the reader's folder"),
    ("docs/GENERATE.md", "model.set_max_sequences(4)", "66d254df", "a fragment: the config's other fields and the "
     "export's arguments are the reader's"),
    ("docs/GENERATE.md", "--max-sequences 4\npython", "d17f8cca", "./my-llama is the reader's folder; e2e.Slots serves "
     "tiny packages of 4 slots, and bench/generate.sh exports and serves SmolLM2's as the second line says"),
    ("docs/GENERATE.md", "quantize_int8(model)", "3742bdf9", "a fragment: `model` is the reader's"),
    ("docs/GENERATE.md", "python examples/smollm2/export.py smollm2-int8.pt2 --weights int8", "7a8a9bc1",
     "llm.SmolLM2GreedyEqualsEager exports the same with --max-seq-len 256 added, to keep its build short"),
    ("docs/SYNC.md", "aotid push mlp oci://registry.example.com", "0c0a1d95",
     "registry.example.com and /mnt/usb are the reader's; sync.PushSyncServeResumeAndRefuse pushes to "
     "and syncs from a registry of its own"),
    ("docs/SYNC.md", "oras push", "42b1b1f4", "oras is not installed here, and registry.example.com is the reader's"),
    ("docs/KUBERNETES.md", "kubectl apply -k deploy/kserve", "57f5c969",
     "needs a cluster with KServe; deploy.ManifestsValidAgainstSchemas validates these manifests and "
     "deploy.RuntimeCommandsServe runs the runtime's container command as the manifest writes it"),
    ("docs/KUBERNETES.md", "kubectl port-forward service/mlp-predictor", "4920c2da",
     "needs a cluster with KServe; deploy.RuntimeCommandsServe sends v2 requests to mlp as the runtime serves it"),
    ("docs/KUBERNETES.md", "k3s kubectl apply -f deploy/edge/namespace.yaml", "2c75c912",
     "needs a k3s node and a registry of the reader's; deploy.DaemonSetCommandsServe runs the DaemonSet's "
     "container with its ConfigMap, Secrets and a loopback registry"),
    ("docs/IMAGE.md", "sudo deploy/image/build.sh", "f34f5395",
     "image.BuiltPushedPulledAndServes runs build.sh with an --out and --tag of its own, without --archive"),
    ("docs/IMAGE.md", "containers-storage:localhost/aotid", "f11ee22b",
     "podman is not installed here; image.BuiltPushedPulledAndServes runs the image's entrypoint with these "
     "mounts and arguments in namespaces of its own (bwrap) and asks /v2/health/ready"),
    ("docs/IMAGE.md", "docker run --rm -p 8080:8080", "5dddd1af",
     "no docker engine here; image.BuiltPushedPulledAndServes runs the same entrypoint and arguments with bwrap"),
    ("docs/IMAGE.md", "umoci unpack --image build-image", "a443077d",
     "image.BuiltPushedPulledAndServes unpacks the pulled image with umoci and runs its entrypoint with these "
     "bwrap namespaces, binds and environment, on a folder and port of its own"),
    ("docs/IMAGE.md", "docker://registry.example.com/aotid", "58f0ea30",
     "registry.example.com is the reader's; image.BuiltPushedPulledAndServes copies to docker-registry on loopback"),
]


def block(test, path, marker):
    """The block `test` runs: the one of `path` holding `marker`, which RUN
    must give to `test`."""
    assert (path, marker) in RUN.get(test, ("", []))[1], \
        f"tests/docs/example_claims.py: {test} does not claim {path}'s block holding {marker!r}"
    return doc_examples.find(path, marker)
