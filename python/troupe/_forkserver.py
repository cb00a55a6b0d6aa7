"""The fork server of a script's DataLoader workers.

Forked from the script when its first ``troupe.data.DataLoader`` is made on an instance of a
cluster, before troupe's runtime starts a thread, it holds the loader's dataset and forks a
worker process of it whenever the node asks (a data instance's first batch of a loader, or a
worker that died replaced). An instance that makes no batches (the dnn instance, while the data
group has room) runs no worker, only this process; every worker is the fork of a process with one
thread, as torch's fork-server start method gives.

The node (actors/train/worker_pool.cpp) talks to it over a SOCK_SEQPACKET socket pair, one JSON
message and its answer at a time:

- ``{"op": "spawn", "loader": k, "worker": i, "workers": W, "seed_offset": o, "slots": P,
  "slot_bytes": B, "host": h}`` with the file descriptors [request pipe's read end, reply pipe's
  write end, the worker's memfd] and, for a loader whose WorkerSpec is not here yet (one made
  after the first), a memfd holding it pickled: ``{"pid": pid}`` or ``{"error": why}``;
- ``{"op": "status", "pid": pid}``: how that worker ended, ``{"exit": code}``, ``{"signal": n}``
  or ``{"running": true}``.

It ends when the node's end closes (the node's process ended), and the kernel ends it when the
script's main thread does (PR_SET_PDEATHSIG); each worker ends with it the same way.
"""

import json
import os
import pickle
import socket
import sys
import time

from troupe import _workers


def start(spec):
    """Forks the fork server holding `spec` (the first loader's WorkerSpec, loader 0); returns
    the node's end of the socket (a file descriptor) and the server's pid."""
    node, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            node.close()
            _die_with_parent()
            _serve(server, {0: spec})
        finally:
            os._exit(1)
    server.close()
    return node.detach(), pid


# A pickled spec travels in each of the loader's augmenters' spawn messages (64 MiB at most).
MAX_PICKLED = 32 << 20


def pickled(spec):
    """`spec` pickled for the fork servers of every instance, or a TypeError naming why not."""
    try:
        data = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - pickle raises many kinds
        raise TypeError(
            f"DataLoader: this loader's dataset or functions cannot be pickled ({type(e).__name__}"
            f": {e}). A DataLoader made after the script's first one reaches the data group "
            "pickled, as torch's 'spawn' workers get theirs (a lambda, a local function or an "
            "open file cannot be); make the first DataLoader with it, or pass local=True to run "
            "this one with torch's DataLoader on this instance") from e
    if len(data) > MAX_PICKLED:
        raise TypeError(
            f"DataLoader: this loader's dataset pickles to {len(data) >> 20} MiB, over the "
            f"{MAX_PICKLED >> 20} MiB a later loader's may (it travels to every data instance in "
            "a message): make it the script's first DataLoader (built on every instance, never "
            "pickled), keep less in it (paths, not pixels), or pass local=True")
    return data


def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:  # noqa: BLE001 - best effort
        pass


def _serve(sock, specs):
    ended = {}  # pid -> os.waitpid status, of workers reaped so far
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)  # the node's process ended
        command = json.loads(message)
        _reap(ended)
        if command["op"] == "spawn":
            answer = _spawn(sock, command, fds, specs)
        elif command["op"] == "status":
            answer = _status(command["pid"], ended)
        else:
            answer = {"error": f"unknown request {command['op']!r}"}
        sock.send(json.dumps(answer).encode())


def _spawn(sock, command, fds, specs):
    loader = command["loader"]
    try:
        request, reply, memory = fds[:3]
        if loader not in specs:
            if len(fds) < 4:
                return {"error": f"DataLoader {loader}'s dataset did not reach this instance"}
            with os.fdopen(fds[3], "rb") as f:
                fds = fds[:3]
                try:
                    specs[loader] = pickle.load(f)
                except Exception as e:  # noqa: BLE001
                    return {"error": f"DataLoader {loader}'s pickled dataset cannot be loaded here "
                                     f"({type(e).__name__}: {e}): a class or function defined in "
                                     "the script after its first DataLoader is not in this "
                                     "instance's fork server; define it before, or pass "
                                     "local=True"}
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                _die_with_parent()
                _workers.worker_main(specs[loader], command, request, reply, memory)
            finally:
                os._exit(1)
        return {"pid": pid}
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _reap(ended):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ended[pid] = status


def _status(pid, ended):
    deadline = time.monotonic() + 2  # a worker whose pipe closed is a zombie within moments
    while pid not in ended and time.monotonic() < deadline:
        time.sleep(0.02)
        _reap(ended)
    status = ended.get(pid)
    if status is None:
        return {"running": True}
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status)}
