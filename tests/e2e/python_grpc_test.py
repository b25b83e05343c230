#!/usr/bin/env python3
"""End-to-end: Python grpcio against a local cluster started with `tandem up`.

Streams a generation, lists the models and checks that a bad request is INVALID_ARGUMENT.

    python_grpc_test.py --tandem build/services/cli/tandem --stubs build/tests/e2e/python
"""
import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import unittest

ARGS = None


def start_cluster(tandem):
    """Runs `tandem up` on a port the OS picks; returns (process, router address)."""
    process = subprocess.Popen([tandem, "up", "--listen", "127.0.0.1:0"],
                               stdout=subprocess.PIPE, text=True)
    lines = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line)
            sys.stderr.write("[tandem up] " + line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=180)
        except queue.Empty:
            process.kill()
            raise RuntimeError("tandem up did not announce the router within 180 s")
        if line is None:
            process.wait()
            raise RuntimeError(f"tandem up exited with status {process.returncode} before "
                               "announcing the router")
        if line.startswith("tandem up listening on "):
            return process, line.split()[-1]


class PythonGrpcTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, ARGS.stubs)
        global grpc, generate_pb2, generate_pb2_grpc
        import grpc
        from tandem.v1 import generate_pb2, generate_pb2_grpc
        cls.process, cls.address = start_cluster(ARGS.tandem)
        cls.channel = grpc.insecure_channel(cls.address)
        cls.stub = generate_pb2_grpc.GenerationStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.process.send_signal(signal.SIGTERM)
        try:
            status = cls.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cls.process.kill()
            raise
        assert status == 0, f"tandem up exited with status {status} after SIGTERM"

    def test_list_models(self):
        reply = self.stub.ListModels(generate_pb2.ListModelsRequest(), timeout=30)
        ids = [model.id for model in reply.models]
        self.assertIn("tandem-target", ids)
        model = reply.models[ids.index("tandem-target")]
        self.assertIn("ar", model.modes)
        self.assertIn("spec", model.modes)
        self.assertEqual(model.max_context, 512)

    def test_streams_a_generation(self):
        request = generate_pb2.GenerateRequest(prompt="def fibonacci(n):", mode="ar",
                                               max_tokens=24)
        chunks = list(self.stub.Generate(request, timeout=120))
        self.assertGreater(len(chunks), 1, "the completion should arrive in several messages")
        tokens = [t for chunk in chunks for t in chunk.token_ids]
        text = "".join(chunk.text for chunk in chunks)
        last = chunks[-1]
        self.assertIn(last.finish_reason, ("stop", "length"))
        self.assertTrue(all(not chunk.finish_reason for chunk in chunks[:-1]))
        self.assertEqual(last.usage.completion_tokens, len(tokens))
        self.assertLessEqual(len(tokens), 24)
        self.assertGreater(last.usage.prompt_tokens, 0)
        self.assertEqual(last.mode, "ar")
        self.assertFalse(last.lossy)
        self.assertTrue(text)

    def test_bad_request_is_invalid_argument(self):
        request = generate_pb2.GenerateRequest(prompt="def f(x):", max_tokens=0)
        with self.assertRaises(grpc.RpcError) as caught:
            list(self.stub.Generate(request, timeout=30))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("max_tokens", caught.exception.details())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tandem", required=True, help="the tandem executable")
    parser.add_argument("--stubs", required=True, help="folder of the generated Python stubs")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
