#!/usr/bin/env python3
"""Record what a real NBD client sends, for the fuzz seed corpora.

Starts `nbdkit memory` on a Unix socket, puts a logging proxy in front of it, runs
one client command against the proxy (`{uri}` in the command is replaced by the
proxy's nbd+unix URI) and writes the bytes the client sent to OUT. Used once to make
fuzz/corpus/nbd_session/*-capture and fuzz/corpus/nbd_proto seeds; see
docs/fuzzing.md.

usage: capture_nbd.py OUT -- CLIENT ARGS...   e.g.
       capture_nbd.py nbdinfo.bin -- nbdinfo --map '{uri}'
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time


def main():
    out = sys.argv[1]
    cmd = sys.argv[sys.argv.index("--") + 1:]
    tmp = tempfile.mkdtemp()
    backend = os.path.join(tmp, "nbdkit.sock")
    front = os.path.join(tmp, "proxy.sock")
    kit = subprocess.Popen(["nbdkit", "-f", "-U", backend, "memory", "1M"])
    for _ in range(100):
        if os.path.exists(backend):
            break
        time.sleep(0.05)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(front)
    listener.listen(1)
    sent = bytearray()

    def serve():
        client, _ = listener.accept()
        server = socket.socket(socket.AF_UNIX)
        server.connect(backend)

        def pump(src, dst, log):
            while True:
                data = src.recv(65536)
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                if log is not None:
                    log.extend(data)
                dst.sendall(data)

        t = threading.Thread(target=pump, args=(server, client, None), daemon=True)
        t.start()
        pump(client, server, sent)
        t.join(timeout=5)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    uri = "nbd+unix:///?socket=" + front
    subprocess.run([a.replace("{uri}", uri) for a in cmd], check=True)
    th.join(timeout=5)
    kit.terminate()
    kit.wait()
    with open(out, "wb") as f:
        f.write(bytes(sent))
    print(f"{out}: {len(sent)} bytes from {cmd[0]}")


if __name__ == "__main__":
    main()
