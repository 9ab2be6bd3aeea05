"""Inside a sandbox: listen on 127.0.0.1:PORT, run the command, and relay TCP to a Unix socket.

    python3 -I -S forwarder.py PORT SOCKET COMMAND [ARG...]
    python3 -I -S forwarder.py --hook PORT SOCKET PIDFILE     (an OCI createRuntime hook)

The second form is the container sandbox's (:mod:`infra.sandbox.runc`): run on the host by runc
after the container's namespaces exist and before its process starts, it reads the container's
state (JSON, on stdin), joins the container's network namespace, listens on 127.0.0.1:PORT there,
forks a server that relays to SOCKET (a host path: the container sees no socket and no file of
this script) and exits once the port is listening, so the container's command finds it at once.
The server writes its pid to PIDFILE and exits when the container's first process does.

A standalone, stdlib-only script (the sandbox sees no site-packages). It is the sandbox's first
process after bwrap's own init. Order of events, which is what makes it safe to start the command
at once: (1) bind and listen on 127.0.0.1:PORT with the plain ``socket`` module, (2) fork and exec
the command (connections it makes now wait in the listen backlog), (3) when the first connection
waits (asyncio is imported meanwhile in a thread), serve with asyncio, relaying each connection
byte for byte in both directions, with half-close, to a new connection on SOCKET (the host's
proxy, bind-mounted in). When the command exits, this process exits at once with the command's
exit code (128 + N if signal N killed it), open connections or not, and the sandbox goes with it.
"""

from __future__ import annotations

import _socket
import _thread
import os
import select
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~40 ms of start-up

if TYPE_CHECKING:  # annotations only: asyncio is imported after the command has started
    from asyncio import StreamReader, StreamWriter
    from socket import socket

CHUNK = 64 * 1024


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


async def _pipe(reader: StreamReader, writer: StreamWriter, other: StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until EOF (then half-close) or an error (then close both)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
        other.close()


async def _relay(client_r: StreamReader, client_w: StreamWriter, target: str) -> None:
    import asyncio

    try:
        up_r, up_w = await asyncio.open_unix_connection(target)
    except OSError as exc:
        print(f"openforge-forwarder: cannot reach the proxy at {target}: {exc}", file=sys.stderr)
        client_w.close()
        return
    await asyncio.gather(_pipe(client_r, up_w, client_w), _pipe(up_r, client_w, up_w))
    client_w.close()
    up_w.close()


async def _serve(listener: socket, target: str, child: int, pidfd: int) -> int:
    import asyncio

    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, on_exit)
    # Kept referenced while serving; never closed: the process exits (os._exit) with the command.
    server = await asyncio.start_server(lambda r, w: _relay(r, w, target), sock=listener)
    await exited
    del server
    return _exit_code(os.waitpid(child, 0)[1])


def _listen(port: int) -> socket:
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(512)
    return listener  # type: ignore[return-value]


def _join_network_namespace(pid: int) -> None:
    import ctypes

    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns into the network namespace of pid {pid}")
    os.close(fd)


async def _serve_until(listener: socket, target: str, pidfd: int) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    gone = loop.create_future()

    def on_exit() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(pidfd, on_exit)
    server = await asyncio.start_server(lambda r, w: _relay(r, w, target), sock=listener)
    await gone
    del server


def hook(argv: list[str]) -> int:
    """The createRuntime hook form (see the module docstring)."""
    import json

    port, target, pidfile = int(argv[0]), argv[1], argv[2]
    pid = int(json.loads(sys.stdin.read())["pid"])
    try:
        _join_network_namespace(pid)
        listener = _listen(port)
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        print(f"openforge-forwarder: cannot listen in the container: {exc}", file=sys.stderr)
        return 1
    server = os.fork()
    if server:
        with open(pidfile, "w") as f:
            f.write(str(server))
        return 0
    os.setsid()  # runc waits for the hook's stdout and stderr to close: hand them back now
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    import asyncio
    import socket as socket_module

    sock = socket_module.socket(fileno=listener.detach())
    asyncio.run(_serve_until(sock, target, pidfd))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--hook"]:
        return hook(argv[1:])
    if len(argv) < 3:
        print("usage: forwarder.py PORT SOCKET COMMAND [ARG...]", file=sys.stderr)
        return 2
    port, target, command = int(argv[0]), argv[1], argv[2:]
    # The C modules (_socket, _thread), not socket and threading: ~20 ms less start-up here.
    listener = _listen(port)
    child = os.fork()
    if child == 0:  # the listener is close-on-exec: the command does not inherit it
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"openforge-sandbox: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        os._exit(127)
    # asyncio takes ~0.1 s to import: warm it up beside the command, but exit as soon as the
    # command does, and start serving only when the first connection is waiting.
    _thread.start_new_thread(__import__, ("asyncio",))
    pidfd = os.pidfd_open(child)
    ready, _, _ = select.select([pidfd, listener.fileno()], [], [])
    if pidfd in ready:
        return _exit_code(os.waitpid(child, 0)[1])
    import asyncio
    import socket as socket_module

    sock = socket_module.socket(fileno=listener.detach())
    return asyncio.run(_serve(sock, target, child, pidfd))


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
