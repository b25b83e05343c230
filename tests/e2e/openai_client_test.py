#!/usr/bin/env python3
"""End-to-end: the official OpenAI Python client against a local cluster started with `tandem up`.

Completions and chat, whole and streamed, the model list, penalties and logit bias (lossless
modes exact with them), logprobs (both shapes, every lossless mode AR's), echo (scoring a prompt),
JSON mode, json_schema (valid in every mode, AR's in every lossless one), tool calls (parsed,
whole and streamed), n choices and best_of, and errors mapped to the client's exception classes
(401 AuthenticationError, 400 BadRequestError, 404 NotFoundError). Runs with the .venv-e2e
interpreter (scripts/setup.sh --e2e); skips when the openai package is missing.

    .venv-e2e/bin/python openai_client_test.py --tandem build/services/cli/tandem
"""
import argparse
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import unittest

try:
    import jsonschema
    import openai
except ImportError:  # reported by the test class below
    openai = None

ARGS = None
KEY = "e2e-key"
# Every lossless mode the bundled models serve.
LOSSLESS_MODES = ("ar", "spec", "jacobi", "self_spec", "self_spec_quadratic", "isd")
# The lossy modes the bundled target serves with its default options.
LOSSY_MODES = ("diffusion", "simsd", "nsp")
RATING = {"type": "object",
          "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]},
                         "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["ok", "level", "score"]}
PARAMETERS = {
    "get_weather": {"type": "object",
                    "properties": {"city": {"enum": ["Paris", "Tokyo"]},
                                   "unit": {"enum": ["c", "f"]}},
                    "required": ["city", "unit"]},
    "get_time": {"type": "object", "properties": {"utc": {"type": "boolean"}},
                 "required": ["utc"]},
}
TOOLS = [{"type": "function",
          "function": {"name": name, "description": f"{name} now", "parameters": parameters}}
         for name, parameters in PARAMETERS.items()]
MODEL = "tandem-target"
PROMPT = "def fibonacci(n):"


def start_cluster(tandem):
    """Runs `tandem up` on ports the OS picks; returns (process, HTTP base URL)."""
    process = subprocess.Popen(
        [tandem, "up", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--api-key", KEY],
        stdout=subprocess.PIPE, text=True)
    lines = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line)
            sys.stderr.write("[tandem up] " + line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    base_url = None
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
        match = re.match(r"tandem up: openai\s+(http://\S+)", line)
        if match:
            base_url = match.group(1)
        if line.startswith("tandem up listening on "):
            if base_url is None:
                process.kill()
                raise RuntimeError("tandem up announced no OpenAI-compatible HTTP address")
            return process, base_url


@unittest.skipIf(openai is None, "the openai or jsonschema package is not installed: run "
                 "scripts/setup.sh --e2e and use .venv-e2e/bin/python")
class OpenAIClientTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.process, cls.base_url = start_cluster(ARGS.tandem)
        cls.client = openai.OpenAI(base_url=cls.base_url, api_key=KEY, max_retries=0,
                                   timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.process.send_signal(signal.SIGTERM)
        try:
            status = cls.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cls.process.kill()
            raise
        assert status == 0, f"tandem up exited with status {status} after SIGTERM"

    def complete(self, max_tokens=16, **kwargs):
        return self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=max_tokens,
                                              temperature=0, extra_body={"mode": "ar"}, **kwargs)

    def test_models(self):
        ids = [model.id for model in self.client.models.list()]
        self.assertEqual(ids, [MODEL])

    def test_completion_whole_and_streamed(self):
        whole = self.complete()
        self.assertEqual(whole.object, "text_completion")
        self.assertEqual(whole.model, MODEL)
        self.assertEqual(len(whole.choices), 1)
        text = whole.choices[0].text
        self.assertTrue(text)
        self.assertIn(whole.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(whole.usage.prompt_tokens, 0)
        self.assertGreater(whole.usage.completion_tokens, 0)
        self.assertLessEqual(whole.usage.completion_tokens, 16)
        self.assertEqual(whole.usage.total_tokens,
                         whole.usage.prompt_tokens + whole.usage.completion_tokens)

        chunks = list(self.complete(stream=True, stream_options={"include_usage": True}))
        self.assertGreater(len(chunks), 2, "the completion should arrive in several chunks")
        streamed = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
        self.assertEqual(streamed, text, "greedy streaming must give the whole response's text")
        finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
        self.assertIn(finishes[-1], ("stop", "length"))
        self.assertTrue(all(reason is None for reason in finishes[:-1]))
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)

    def test_chat_whole_and_streamed(self):
        messages = [{"role": "system", "content": "You write Python."},
                    {"role": "user", "content": "Write a function that adds two numbers."}]
        whole = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                                    temperature=0, extra_body={"mode": "ar"})
        self.assertEqual(whole.object, "chat.completion")
        message = whole.choices[0].message
        self.assertEqual(message.role, "assistant")
        self.assertTrue(message.content)
        self.assertLessEqual(whole.usage.completion_tokens, 12)

        stream = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"mode": "ar"})
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks
                          if chunk.choices)
        self.assertEqual(content, message.content)
        with_choices = [chunk for chunk in chunks if chunk.choices]
        self.assertIn(with_choices[-1].choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(chunks[-1].usage.total_tokens, whole.usage.total_tokens)

    def test_penalties_change_the_output_and_keep_lossless_modes_exact(self):
        plain = self.complete(max_tokens=32).choices[0].text
        adjusted = {}
        for mode in ("ar", "spec", "jacobi", "self_spec", "self_spec_quadratic"):
            adjusted[mode] = self.client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, presence_penalty=0.8,
                frequency_penalty=1.0, logit_bias={"11": -5},
                extra_body={"mode": mode, "repetition_penalty": 1.2, "min_tokens": 8},
            ).choices[0].text
        self.assertNotEqual(adjusted["ar"], plain)
        for mode, text in adjusted.items():
            self.assertEqual(text, adjusted["ar"], f"{mode} with penalties differs from ar")

        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(presence_penalty=2.5)
        self.assertEqual(caught.exception.param, "presence_penalty")

    def test_logprobs_in_both_apis_and_every_lossless_mode(self):
        messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
        by_mode = {}
        for mode in ("ar", "spec", "jacobi", "self_spec"):
            response = self.client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=12, temperature=0, logprobs=True,
                top_logprobs=3, extra_body={"mode": mode})
            content = response.choices[0].logprobs.content
            self.assertEqual(len(content), response.usage.completion_tokens)
            for entry in content:
                self.assertLessEqual(entry.logprob, 0.0)
                self.assertEqual(len(entry.top_logprobs), 3)
                # Greedy: the chosen token is the most likely one.
                self.assertEqual(entry.top_logprobs[0].token, entry.token)
                self.assertEqual(entry.top_logprobs[0].logprob, entry.logprob)
                self.assertEqual(bytes(entry.bytes).decode("utf-8", "replace") != "", True)
            by_mode[mode] = [(entry.token, entry.logprob) for entry in content]
        for mode, entries in by_mode.items():
            self.assertEqual([t for t, _ in entries], [t for t, _ in by_mode["ar"]], mode)
            for (_, got), (_, want) in zip(entries, by_mode["ar"]):
                self.assertAlmostEqual(got, want, delta=1e-4, msg=mode)

        whole = self.complete(logprobs=2)
        legacy = whole.choices[0].logprobs
        self.assertEqual(len(legacy.tokens), whole.usage.completion_tokens)
        self.assertEqual(len(legacy.token_logprobs), len(legacy.tokens))
        self.assertEqual(legacy.text_offset[0], 0)
        self.assertTrue(all(len(top) >= 2 for top in legacy.top_logprobs))
        streamed = [chunk.choices[0].logprobs for chunk in self.complete(logprobs=2, stream=True)
                    if chunk.choices and chunk.choices[0].logprobs]
        self.assertEqual(sum((chunk.token_logprobs for chunk in streamed), []),
                         legacy.token_logprobs)

        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=2,
                                           extra_body={"mode": "diffusion"})
        self.assertIn("lossy", caught.exception.message)

    def test_echo_scores_a_prompt_as_evaluation_harnesses_ask(self):
        # lm-evaluation-harness' loglikelihood request: echo, logprobs, no new tokens.
        scored = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0,
                                                echo=True, logprobs=1, temperature=0)
        choice = scored.choices[0]
        self.assertEqual(choice.text, PROMPT)
        self.assertEqual(len(choice.logprobs.tokens), scored.usage.prompt_tokens)
        self.assertEqual(scored.usage.completion_tokens, 0)
        self.assertIsNone(choice.logprobs.token_logprobs[0])
        self.assertIsNone(choice.logprobs.top_logprobs[0])
        self.assertTrue(all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:]))
        self.assertEqual("".join(choice.logprobs.tokens), PROMPT)

        # With a completion: the prompt leads the text, streamed or not, and its tokens lead
        # the logprobs; the completion's logprobs are the same as without echo.
        whole = self.complete(echo=True, logprobs=0)
        plain = self.complete(logprobs=0)
        self.assertEqual(whole.choices[0].text, PROMPT + plain.choices[0].text)
        prompt_tokens = whole.usage.prompt_tokens
        # The prompt ran in other extend shapes (every row an output): equal up to rounding.
        for got, want in zip(whole.choices[0].logprobs.token_logprobs[prompt_tokens:],
                             plain.choices[0].logprobs.token_logprobs, strict=True):
            self.assertAlmostEqual(got, want, delta=1e-4)
        streamed = "".join(chunk.choices[0].text for chunk in self.complete(echo=True, stream=True)
                           if chunk.choices)
        self.assertEqual(streamed, whole.choices[0].text)

    def test_json_mode_stays_json_in_every_lossless_mode(self):
        messages = [{"role": "user", "content": "Describe a function as JSON."}]
        texts = {}
        for mode in ("ar", "spec", "jacobi"):
            response = self.client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=24, temperature=0,
                response_format={"type": "json_object"}, extra_body={"mode": mode})
            texts[mode] = response.choices[0].message.content
            if response.choices[0].finish_reason == "stop":
                json.loads(texts[mode])
        self.assertTrue(texts["ar"].startswith("{"), texts["ar"])
        self.assertEqual(texts["spec"], texts["ar"])
        self.assertEqual(texts["jacobi"], texts["ar"])

    def test_json_schema_validates_in_every_lossless_mode(self):
        messages = [{"role": "user", "content": "Rate the weather as JSON."}]
        texts = {}
        for mode in LOSSLESS_MODES:
            response = self.client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=200, temperature=0,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "rating", "schema": RATING,
                                                 "strict": True}},
                extra_body={"mode": mode})
            choice = response.choices[0]
            self.assertEqual(choice.finish_reason, "stop", f"{mode}: {choice.message.content!r}")
            jsonschema.validate(json.loads(choice.message.content), RATING)
            texts[mode] = choice.message.content
        for mode, text in texts.items():
            self.assertEqual(text, texts["ar"], mode)
        # Sampled, too: still valid.
        sampled = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=200, temperature=0.8, seed=7,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "rating", "schema": RATING}},
            extra_body={"mode": "spec"})
        jsonschema.validate(json.loads(sampled.choices[0].message.content), RATING)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4,
                response_format={"type": "json_schema", "json_schema": {"name": "x"}})
        self.assertEqual(caught.exception.param, "response_format.json_schema.schema")

    def test_json_schema_validates_in_the_lossy_modes(self):
        messages = [{"role": "user", "content": "Rate the weather as JSON."}]
        for mode in LOSSY_MODES:
            for temperature in (0, 0.8):
                response = self.client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=400, temperature=temperature,
                    seed=7, response_format={"type": "json_schema",
                                             "json_schema": {"name": "rating", "schema": RATING,
                                                             "strict": True}},
                    extra_body={"mode": mode})
                choice = response.choices[0]
                self.assertEqual(response.model_extra["tandem"], {"mode": mode, "lossy": True})
                self.assertEqual(choice.finish_reason, "stop",
                                 f"{mode}: {choice.message.content!r}")
                jsonschema.validate(json.loads(choice.message.content), RATING)

    def test_tools_return_parsed_calls(self):
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]

        def ask(mode="ar", max_tokens=200, **kwargs):
            return self.client.chat.completions.create(
                model=MODEL, messages=messages, tools=TOOLS, max_tokens=max_tokens, temperature=0,
                extra_body={"mode": mode}, **kwargs)

        calls = {}
        for mode in LOSSLESS_MODES:
            choice = ask(mode, tool_choice="required", parallel_tool_calls=False).choices[0]
            self.assertEqual(choice.finish_reason, "tool_calls", f"{mode}: {choice.message!r}")
            self.assertIsNone(choice.message.content)
            self.assertEqual(len(choice.message.tool_calls), 1)
            call = choice.message.tool_calls[0]
            self.assertTrue(call.id.startswith("call_"))
            self.assertEqual(call.type, "function")
            self.assertIn(call.function.name, PARAMETERS)
            jsonschema.validate(json.loads(call.function.arguments),
                                PARAMETERS[call.function.name])
            calls[mode] = (call.function.name, call.function.arguments)
        for mode, call in calls.items():
            self.assertEqual(call, calls["ar"], mode)

        named = ask(tool_choice={"type": "function", "function": {"name": "get_time"}})
        self.assertEqual([c.function.name for c in named.choices[0].message.tool_calls],
                         ["get_time"])
        jsonschema.validate(json.loads(named.choices[0].message.tool_calls[0].function.arguments),
                            PARAMETERS["get_time"])

        # Streamed: the same call, whole in one delta, and finish_reason tool_calls.
        streamed, finish = [], None
        for chunk in ask(tool_choice="required", parallel_tool_calls=False, stream=True):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            streamed.extend(delta.tool_calls or [])
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(finish, "tool_calls")
        self.assertEqual([(c.function.name, c.function.arguments) for c in streamed],
                         [calls["ar"]])
        self.assertEqual(streamed[0].index, 0)

        # none: text, no calls. A follow-up turn with the call and its answer is accepted.
        plain = ask(tool_choice="none", max_tokens=8).choices[0]
        self.assertIsNone(plain.message.tool_calls)
        self.assertIsInstance(plain.message.content, str)
        follow = self.client.chat.completions.create(
            model=MODEL, max_tokens=8, temperature=0, tools=TOOLS, extra_body={"mode": "ar"},
            messages=messages + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": json.dumps({"city": "Paris", "unit": "c"})}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}])
        self.assertEqual(follow.choices[0].message.role, "assistant")
        with self.assertRaises(openai.BadRequestError) as caught:
            ask(tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assertEqual(caught.exception.param, "tool_choice")

    def test_n_choices_are_reproducible_and_best_of_ranks(self):
        def three():
            return self.client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.9, seed=42, n=3,
                extra_body={"mode": "ar"})
        first, again = three(), three()
        texts = [choice.text for choice in first.choices]
        self.assertEqual([choice.index for choice in first.choices], [0, 1, 2])
        self.assertEqual(texts, [choice.text for choice in again.choices])
        self.assertEqual(len(set(texts)), 3, "each choice has its own seed stream")
        # Every choice's tokens, the prompt once.
        self.assertGreaterEqual(first.usage.completion_tokens, 3)
        self.assertLessEqual(first.usage.completion_tokens, 3 * 12)
        self.assertEqual(first.usage.total_tokens,
                         first.usage.prompt_tokens + first.usage.completion_tokens)

        streamed = {}
        for chunk in self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Write a function."}],
                max_tokens=8, temperature=0.9, seed=5, n=2, stream=True,
                extra_body={"mode": "ar"}):
            for choice in chunk.choices:
                streamed[choice.index] = streamed.get(choice.index, "") + (
                    choice.delta.content or "")
        whole = self.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Write a function."}],
            max_tokens=8, temperature=0.9, seed=5, n=2, extra_body={"mode": "ar"})
        self.assertEqual([streamed[0], streamed[1]],
                         [choice.message.content for choice in whole.choices])

        best = self.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=3, n=1, best_of=4,
            logprobs=0, extra_body={"mode": "ar"})
        candidates = self.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=3, n=4,
            logprobs=0, extra_body={"mode": "ar"})

        def mean(choice):
            values = choice.logprobs.token_logprobs
            return sum(values) / len(values)
        self.assertEqual(len(best.choices), 1)
        self.assertEqual(best.choices[0].text,
                         max(candidates.choices, key=mean).text)
        self.assertEqual(best.usage.completion_tokens, candidates.usage.completion_tokens)

    def test_errors_map_to_client_exceptions(self):
        wrong_key = openai.OpenAI(base_url=self.base_url, api_key="not-the-key", max_retries=0)
        with self.assertRaises(openai.AuthenticationError) as caught:
            wrong_key.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        self.assertEqual(caught.exception.status_code, 401)
        wrong_key.close()

        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(n=17)
        self.assertEqual(caught.exception.status_code, 400)
        self.assertEqual(caught.exception.param, "n")

        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
        self.assertIn("max_tokens", caught.exception.message)

        with self.assertRaises(openai.NotFoundError) as caught:
            self.client.chat.completions.create(model="gpt-4o", max_tokens=4,
                                                messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(caught.exception.code, "model_not_found")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tandem", required=True, help="the tandem executable")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
