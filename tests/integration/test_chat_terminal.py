"""``genai-runtime chat`` at a real terminal: a pseudo-terminal (pexpect) driven by keystrokes,
its output rendered by a terminal emulator (pyte), and every check made on the screen text.

One session on SmolLM2: three turns (the first edited with the arrow keys), a reply stopped by
Ctrl-C, a fourth turn, /save, /help, /reset, /system, then turns until the context is full and the
oldest are dropped, then Ctrl-D. The replies expected on screen are computed in this process by a
``ChatSession`` that never saw the stopped turn, so they show what each turn was given.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from genai_runtime import Model, Tokenizer
from genai_runtime.chat import ChatSession

pexpect = pytest.importorskip("pexpect", reason="needs pexpect (the dev extra)")
pyte = pytest.importorskip("pyte", reason="needs pyte (the dev extra)")

MAX_NEW, MAX_LENGTH = 16, 256
FIRST = ["My name is Ada.", "I live in Paris.", "What is two plus two?"]
STOPPED = "Tell me a very long story about a dragon."
FOURTH = "What is my name?"
LATER = ["Name a colour.", "Name a fruit.", "Name a city.", "Name an animal.", "Name a tree."]
SYSTEM = "You are a helpful assistant who answers in one short sentence. " * 16  # ~190 tokens
LEFT = "\x1b[D"


class Terminal:
    """A child process on a pseudo-terminal and the screen it has drawn so far."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int = 100, cols: int = 220):
        self.child = pexpect.spawn(argv[0], argv[1:], env=env, dimensions=(rows, cols))
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display).rstrip()

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def pump(self, timeout: float = 0.05) -> bool:
        """Feed what the child wrote to the screen; False once it has exited."""
        try:
            self.stream.feed(self.child.read_nonblocking(65536, timeout=timeout))
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            return False
        return True

    def wait(self, done, what: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if not self.pump() and not done():
                pytest.fail(f"chat exited while waiting for {what}; screen:\n{self.text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}; screen:\n{self.text()}")

    def prompts(self) -> int:
        return sum(line.startswith(">") for line in self.lines())

    def idle(self) -> bool:
        """The last line is an empty prompt: the chat waits for input."""
        lines = self.lines()
        return bool(lines) and lines[-1] == ">"

    def send(self, keys: str) -> None:
        """Type ``keys`` and Enter; wait for the next prompt."""
        before = self.prompts()
        self.child.send(keys + "\r")
        self.wait(lambda: self.idle() and self.prompts() > before, repr(keys))


def flat(text: str) -> str:
    return " ".join(text.split())


def expected_replies(model_dir: Path) -> list[str]:
    """The replies a session that never saw the stopped turn gives, with the same options."""
    model = Model(model_dir)
    session = ChatSession(
        model, Tokenizer(model), max_new_tokens=MAX_NEW, drop_oldest=True, max_length=MAX_LENGTH
    )
    return ["".join(session.send(text)) for text in [*FIRST, FOURTH]]


def test_chat_at_a_terminal(smollm2_dir, tmp_path, request):
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "TERM": "xterm",
        "INPUTRC": os.devnull,  # no user key bindings
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "genai_runtime", "chat", str(smollm2_dir)]
    # --greedy: the replies computed here are the config's (greedy) ones
    argv += ["--max-new-tokens", str(MAX_NEW), "--max-length", str(MAX_LENGTH), "--greedy"]
    term = Terminal(argv, env)
    request.addfinalizer(lambda: term.child.terminate(force=True))  # if a check fails midway
    want = expected_replies(smollm2_dir)
    term.wait(term.idle, "the first prompt")
    assert re.search(
        r"smollm2-135m-instruct-int4 \| context 256 tokens \| /help for commands", term.text()
    )

    # Turn 1, typed with a typo and mended with the left arrow; turns 2 and 3.
    term.send("My name is Aa." + LEFT + LEFT + "d")
    assert "> My name is Ada." in term.lines()
    for text in FIRST[1:]:
        term.send(text)
    screen = flat(term.text())
    for text, reply in zip(FIRST, want[:3]):
        assert flat(f"> {text} {reply} [cut at {MAX_NEW} tokens: --max-new-tokens]") in screen

    # A reply stopped by Ctrl-C once it has begun: frozen while the key is pressed, so the stop
    # lands mid-reply however busy the machine is.
    term.child.send(STOPPED + "\r")
    row = len(term.lines())
    term.wait(lambda: len(term.lines()) > row and term.lines()[row].strip(), "the reply to stop")
    term.child.kill(signal.SIGSTOP)
    term.child.sendintr()
    term.child.kill(signal.SIGCONT)
    term.wait(term.idle, "the prompt after Ctrl-C")
    assert term.lines()[row].endswith(" [stopped]")
    assert "(reply stopped; that turn is forgotten. Ctrl-C again or Ctrl-D leaves)" in term.text()

    # Turn 4 answers the first three turns alone: the reply a session without the stopped turn
    # gives, token for token.
    term.send(FOURTH)
    assert flat(f"> {FOURTH} {want[3]} [cut at") in flat(term.text())
    saved = tmp_path / "chat.json"
    term.send(f"/save {saved}")
    assert f"(saved 8 messages to {saved})" in term.text()
    messages = json.loads(saved.read_text())
    assert [m["content"] for m in messages if m["role"] == "user"] == [*FIRST, FOURTH]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == want

    # /help is answered by the chat, not sent to the model; /reset starts over.
    term.send("/help")
    for line in ("/help", "/reset", "/system TEXT", "/save FILE", "/quit"):
        assert re.search(rf"^  {re.escape(line)} ", term.text(), re.M), line
    term.send("/reset")
    assert "(conversation cleared)" in term.text()

    # A long system message, then turns until the context is full: the oldest turns go, with a
    # notice, the system message stays, and the chat goes on.
    term.send(f"/system {SYSTEM.strip()}")
    assert "(system message set)" in term.text()
    notice = "(the context is full: dropped the oldest turn)"
    for text in LATER:
        term.send(text)
        if notice in term.text():
            break
    assert notice in term.text()
    term.send(f"/save {saved}")
    messages = json.loads(saved.read_text())
    assert messages[0] == {"role": "system", "content": SYSTEM.strip()}
    kept = [m["content"] for m in messages if m["role"] == "user"]
    assert kept[0] != LATER[0] and kept[-1] == text

    # Ctrl-D leaves; the edited line is in the history file.
    term.child.sendeof()
    term.wait(lambda: not term.child.isalive(), "the chat to exit", timeout=30)
    term.child.close()
    assert term.child.exitstatus == 0
    history = (tmp_path / "cache" / "genai_runtime" / "chat_history").read_text()
    assert "My name is Ada." in history and FOURTH in history


def test_chat_defaults_end_a_reply_inside_the_screen(smollm2_dir, tmp_path, request):
    """With no flags (the command line's sampling, reply cap and loop guard): a long reply
    stopped by Ctrl-C, then a one-word question gets a reply that ends by itself, well inside an
    80 x 24 screen (the terminal is taller, so nothing scrolls away from the checks)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "TERM": "xterm"}
    env |= {"INPUTRC": os.devnull, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "genai_runtime", "chat", str(smollm2_dir)]
    term = Terminal(argv, env, rows=100, cols=80)
    request.addfinalizer(lambda: term.child.terminate(force=True))
    term.wait(term.idle, "the first prompt")
    term.child.send(STOPPED + "\r")
    term.wait(lambda: not term.idle() and len(term.text().split(STOPPED, 1)[-1]) > 20, "a reply")
    term.child.kill(signal.SIGSTOP)
    term.child.sendintr()
    term.child.kill(signal.SIGCONT)
    term.wait(term.idle, "the prompt after Ctrl-C")
    assert " [stopped]" in term.text()
    question = "What is the capital of France? Answer in one word."
    term.send(question)  # waits for the next prompt: the reply ended by itself
    reply = term.text().rsplit(question, 1)[-1].removesuffix(">").strip()
    assert "[cut at" not in reply, reply  # ended by EOS (or the loop guard), not the cap
    # Sampled replies vary in length; even a long one must leave the screen room to spare.
    assert len(reply.splitlines()) <= 20, reply  # inside the 24 rows with the prompt lines
