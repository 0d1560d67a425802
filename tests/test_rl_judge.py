"""Reasoning-SQL's LLM judge inside RL: with ``rewards.reasoning_sql.judge_backend: openai`` the
trainer asks an OpenAI-compatible server (here a real HTTP server on 127.0.0.1) about wrong
rollouts. A judge that answers nonsense or too late scores 0, the step goes on, and the
``judge/failed`` counter says how often."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

torch = pytest.importorskip("torch")

from corpora import half_right_sft, school_corpus as _corpus, school_settings as _settings  # noqa: E402  (the school corpus, tiny sizes)

from progress_sql.train.sft import run_sft  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402
from progress_sql.train.trainer import run_rl  # noqa: E402

TIMEOUT_S = 0.5


class JudgeServer:
    """``/v1/chat/completions`` answering every request per ``mode``: ``score`` (Score: 0.5),
    ``malformed`` (no score in the reply) or ``slow`` (past the client's timeout)."""

    def __init__(self) -> None:
        self.mode, self.requests = "score", []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, body))
                if server.mode == "slow":
                    time.sleep(TIMEOUT_S * 3)
                content = "Score: 0.5" if server.mode == "score" else "The query looks plausible."
                reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (slow mode)
                    pass

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "JudgeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _reasoning_settings(init_from=""):
    s = _settings(init_from)
    s.rl.recipe, s.rl.env, s.rl.steps = "reasoning_sql", "single_turn", 1
    judge = s.rewards.reasoning_sql
    judge.judge_model, judge.judge_timeout_s = "judge", TIMEOUT_S
    return s


@pytest.fixture(scope="module")
def reasoning_policy(tmp_path_factory):
    """The tiny model after a short SFT in Reasoning-SQL's tags: its rollouts hold SQL, some wrong."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("judge")
    corpus = _corpus(root / "corpus")
    s = _reasoning_settings()
    base = build_tiny_model(corpus, s, root / "base")
    run_sft(half_right_sft(s, base, 60.0), corpus, out_dir=root / "sft", progress=False)
    return corpus, root / "sft"


@pytest.mark.slow
def test_rl_asks_the_judge_and_survives_a_bad_one(reasoning_policy, tmp_path):
    corpus, policy = reasoning_policy
    with JudgeServer() as server:
        figures = {}
        for mode in ("score", "malformed", "slow"):
            server.mode, server.requests = mode, []
            s = _reasoning_settings(policy)
            s.rewards.reasoning_sql.judge_backend, s.rewards.reasoning_sql.judge_endpoint = "openai", server.url
            started = time.monotonic()
            result = run_rl(s, corpus, out_dir=tmp_path / mode, progress=False)
            m = result.metrics[0]
            figures[mode] = (m, len(server.requests), time.monotonic() - started)
            assert result.steps == 1 and math.isfinite(m["loss"]), mode
            assert {path for path, _ in server.requests} <= {"/v1/chat/completions"}
            assert all(body["model"] == "judge" and body["temperature"] == 0.0 for _, body in server.requests)

    scored, asked, _ = figures["score"]
    assert asked > 0 and scored["judge/asked"] == asked and scored["judge/failed"] == 0
    assert scored["reward/judge"] > 0  # 0.5 × the judge weight on the wrong rollouts it was asked about
    for mode in ("malformed", "slow"):
        m, requests, _ = figures[mode]
        assert requests > 0 and m["judge/failed"] == requests and m["judge/asked"] == 0, mode
        assert m["reward/judge"] == 0.0, mode  # a failed judge scores 0, the step goes on
    assert figures["slow"][2] < figures["score"][2] + figures["slow"][1] * (TIMEOUT_S + 1.0)  # bounded by the timeout


def test_rl_without_a_judge_backend_does_not_ask(reasoning_policy, tmp_path):
    corpus, policy = reasoning_policy
    with JudgeServer() as server:
        s = _reasoning_settings(policy)
        s.rewards.reasoning_sql.judge_endpoint = server.url  # configured, but judge_backend stays "off"
        result = run_rl(s, corpus, out_dir=tmp_path / "off", progress=False)
        assert server.requests == [] and "judge/asked" not in result.metrics[0]
        assert result.metrics[0]["reward/judge"] == 0.0
