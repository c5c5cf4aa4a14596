"""The Python worker that runs model code inside the sandbox: the standard library only.

``palaestra.repl`` starts it as ``python -I -S -c SOURCE CONFIG`` (so it needs no file of its
own inside the sandbox). Before any model code runs it moves its protocol pipes to private
descriptors, points descriptors 0-2 at ``/dev/null`` and a capture file (so output of child
processes is shown, and cannot reach the protocol), and sets its rlimits. Then it answers one
JSON request per line:

- ``{"op": "run", "code": ..., "cpu": seconds}``: run ``code`` in the persistent namespace; the
  reply has ``stdout``, ``stderr`` (each cut to ``output_chars``, with the full length), ``value``
  (the ``repr`` of a last expression that is not None), ``error`` (the traceback), ``restart``
  (the worker should not be trusted further: a ``MemoryError``) and ``final`` (RLM answers).
- ``{"op": "set", "name": ..., "value": ...}``: bind a JSON value to a name (an RLM context).

With ``rlm`` in its config the namespace holds ``llm_query``, ``llm_query_batched`` and
``FINAL``, which talk to the host over the Unix socket in ``PALAESTRA_SOCKET_LLM``.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import linecache
import os
import resource
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

CAPTURE = ".palaestra-output"  # in /tmp: what child processes write to descriptors 1 and 2


class Capped(io.TextIOBase):
    """A text stream that keeps its first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.kept, self.total = limit, 0, 0
        self.parts: list[str] = []

    def write(self, text: Any) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        if self.kept < self.limit:
            piece = text[: self.limit - self.kept]
            self.parts.append(piece)
            self.kept += len(piece)
        return len(text)

    def writable(self) -> bool:
        return True

    @property
    def text(self) -> str:
        return "".join(self.parts)


def set_limit(which: int, soft: int, hard: int | None = None) -> None:
    """Lower an rlimit to (soft, hard), never above the hard limit the worker was given."""
    _, old_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if old_hard != resource.RLIM_INFINITY:
        hard = min(hard, old_hard)
    resource.setrlimit(which, (min(soft, hard), hard))


def cpu_used() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.capture = os.path.join(config["tmp"], CAPTURE)
        self.limit = int(config["output_chars"])
        self.cells = 0
        self.final: str | None = None
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        if config.get("rlm"):
            self.namespace.update(
                llm_query=self.llm_query, llm_query_batched=self.llm_query_batched, FINAL=self.give_final
            )

    # what the model's code can call in an RLM
    def llm_query(self, prompt: str) -> str:
        """Ask the sub-model ``prompt``; its reply as text."""
        return self.llm_query_batched([prompt])[0]

    def llm_query_batched(self, prompts: list[str]) -> list[str]:
        """Ask the sub-model every prompt (concurrently); the replies in order."""
        if not isinstance(prompts, list | tuple) or not all(isinstance(p, str) for p in prompts):
            raise TypeError("llm_query_batched takes a list of strings")
        path = os.environ.get("PALAESTRA_SOCKET_LLM")
        if not path:
            raise RuntimeError("no sub-model is connected to this REPL")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(path)
            conn.sendall(json.dumps({"prompts": list(prompts)}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        reply = json.loads(data or b'{"error": "the host closed the connection"}')
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return [str(a) for a in reply["answers"]]

    def give_final(self, answer: Any) -> Any:
        """Give the final answer of the rollout."""
        self.final = answer if isinstance(answer, str) else repr(answer)
        return answer

    def run(self, code: str, cpu: int) -> dict[str, Any]:
        set_limit(resource.RLIMIT_CPU, int(cpu_used()) + 1 + cpu, resource.getrlimit(resource.RLIMIT_CPU)[1])
        out, err = Capped(self.limit), Capped(self.limit)
        value = error = None
        restart = False
        self.cells += 1
        name = f"<cell {self.cells}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        sys.stdout, sys.stderr = out, err
        try:
            tree = ast.parse(code, name, "exec")
            last = tree.body[-1] if tree.body else None
            if isinstance(last, ast.Expr):
                tree.body.pop()
            else:
                last = None
            exec(compile(tree, name, "exec"), self.namespace)
            if last is not None:
                result = eval(compile(ast.Expression(last.value), name, "eval"), self.namespace)
                if result is not None:
                    value = repr(result)
        except BaseException as exc:  # noqa: BLE001 - whatever model code raises is its error to read
            restart = isinstance(exc, MemoryError)
            error = self.describe(exc)
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        more, more_total = self.drain()
        reply = {
            "stdout": out.text + more,
            "stdout_total": out.total + more_total,
            "stderr": err.text,
            "stderr_total": err.total,
            "value": None if value is None else value[: self.limit],
            "value_total": 0 if value is None else len(value),
            "error": error,
            "restart": restart,
            "final": self.final,
            "cpu": cpu_used(),
        }
        return reply

    def describe(self, exc: BaseException) -> str:
        """The traceback of ``exc`` without the worker's own frames."""
        try:
            shown = traceback.TracebackException.from_exception(exc)
            shown.stack = traceback.StackSummary.from_list(
                [f for f in shown.stack if f.filename.startswith("<cell")]
            )
            text = "".join(shown.format())
        except BaseException:  # noqa: BLE001 - a broken __str__ or a recursion: say what it was
            text = f"{type(exc).__name__} (its message cannot be shown)\n"
        return text[: self.limit]

    def drain(self) -> tuple[str, int]:
        """What child processes wrote to descriptors 1 and 2 since the last call; the file is emptied."""
        try:
            with open(self.capture, "r+b", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                data = f.read(self.limit * 4)
                f.truncate(0)
        except OSError:
            return "", 0
        return data.decode("utf-8", "replace")[: self.limit], size


def watch(fd: int) -> None:
    """End the worker when the host's end of the reply pipe closes (the host died): the sandbox
    ends with its worker, whatever the model's code is doing."""
    poller = select.poll()
    poller.register(fd, 0)  # a write end reports only POLLERR (reader gone), POLLHUP and POLLNVAL
    while True:
        if poller.poll():
            os._exit(1)


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("parent"):  # no PID namespace (rlimits mode): die with the process that started us
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != config["parent"]:
            os._exit(1)
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    capture = os.open(
        os.path.join(config["tmp"], CAPTURE), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    )
    os.dup2(capture, 1)
    os.dup2(capture, 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file size limit fails instead
    mb = 2**20
    set_limit(resource.RLIMIT_AS, int(config["memory_mb"]) * mb)
    set_limit(resource.RLIMIT_FSIZE, int(config["disk_mb"]) * mb)
    set_limit(resource.RLIMIT_NOFILE, 256)
    set_limit(resource.RLIMIT_CORE, 0)
    set_limit(resource.RLIMIT_NPROC, int(config["max_processes"]))
    set_limit(resource.RLIMIT_CPU, int(config["cpu_seconds"]))
    threading.Thread(target=watch, args=(replies.fileno(),), daemon=True).start()
    worker = Worker(config)
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        if request["op"] == "set":
            worker.namespace[request["name"]] = request["value"]
            reply: dict[str, Any] = {"ok": True}
        else:
            reply = worker.run(request["code"], int(request["cpu"]))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
