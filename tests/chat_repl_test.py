#!/usr/bin/env python3
"""`clawmine chat` driven through a pseudo-terminal, as a person would: loading
shows its progress on the terminal, two turns, Ctrl-C during each answer must
stop the answer (" [stopped]") but not the program, /reset confirms and keeps
it alive, and /exit ends it with status 0.
Usage: chat_repl_test.py --clawmine BIN --model DIR"""
import argparse
import os
import pty
import select
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clawmine", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(a.clawmine, ["clawmine", "chat", "-m", a.model, "-n", "1000000", "--temp", "0.9", "-s", "3",
                              "-t", "1"])
    out = bytearray()

    def pump(seconds, until=None):
        end = time.time() + seconds
        while time.time() < end:
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                try:
                    out.extend(os.read(fd, 65536))
                except OSError:
                    return
            if until and until in out:
                return

    pump(10, b"> ")
    assert b"mapping and validating every tensor" in out and b"tensors," in out and b"validated in" in out, \
        "no loading progress on the terminal: %r" % bytes(out[:500])
    for question in (b"And God said", b"who art thou"):
        before = len(out)
        os.write(fd, question + b"\r")
        pump(1.5)
        assert len(out) > before + len(question) + 20, "no answer streamed: %r" % bytes(out[before:])
        os.write(fd, b"\x03")  # Ctrl-C
        pump(5, b"[stopped]")
        pump(1)
    os.write(fd, b"/reset\r")
    pump(3, b"history cleared")
    assert b"history cleared" in out, bytes(out[-500:])
    os.write(fd, b"/exit\r")
    pump(5)
    _, status = os.waitpid(pid, 0)
    text = out.decode("utf-8", "replace")
    assert text.count("[stopped]") == 2, text[-2000:]
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, ("status", status, text[-2000:])
    print("chat_repl_test: Ctrl-C stopped 2 answers; the REPL went on and exited cleanly")


if __name__ == "__main__":
    main()
