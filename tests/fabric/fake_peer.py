#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fake_peer.py: hostile peers for the fabric's TCP side channel.

Each mode plays one kind of bad peer against `kvbm fabric-node`:

  connect-close PORT     connects and hangs up at once
  ff-hello PORT          sends the hello of the old, unauthenticated protocol
                         whose 200-byte "worker address" of 0xff made UCX
                         assert and abort the receiver
  junk PORT              sends 4 KiB of random bytes
  reflect PORT           sends the listener's own challenge back to it
  silent PORT SECONDS    connects and says nothing for SECONDS
  listen-ff PORTFILE     a fake receiver: listens, writes its port to
                         PORTFILE, answers the first connection with the
                         0xff hello

A peer that sends something waits until the other end closes the
connection (it refused us), so the caller knows the refusal happened.
"""
import os
import socket
import struct
import sys
import time


def ff_hello():
    label, addr = b"evil", b"\xff" * 200
    body = b"KVFU" + struct.pack("<III", 1, len(label), len(addr)) + label + addr
    return struct.pack("<I", len(body)) + body


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.settimeout(30)
    return s


def until_closed(s):
    try:
        while s.recv(4096):
            pass
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()


def recv_exactly(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise SystemExit("peer closed before sending %d bytes" % n)
        b += c
    return b


def main():
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == "listen-ff":
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        tmp = arg + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % ls.getsockname()[1])
        os.rename(tmp, arg)
        ls.settimeout(30)
        s, _ = ls.accept()
        s.settimeout(30)
        s.sendall(ff_hello())
        until_closed(s)
        return
    port = int(arg)
    s = connect(port)
    if mode == "connect-close":
        s.close()
    elif mode == "ff-hello":
        s.sendall(ff_hello())
        until_closed(s)
    elif mode == "junk":
        try:
            s.sendall(os.urandom(4096))
        except (BrokenPipeError, ConnectionResetError):
            pass
        until_closed(s)
    elif mode == "reflect":
        s.sendall(recv_exactly(s, 40))
        until_closed(s)
    elif mode == "silent":
        time.sleep(float(sys.argv[3]))
        s.close()
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
