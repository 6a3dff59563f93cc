"""ServerProcess: launch an inference server, wait for health, always kill its whole process tree.

    with ServerProcess(argv, env=extra_env, log_path=job_dir / "server.log", port=port) as srv:
        ...  # srv.base_url, srv.pid, srv.start_s

- The server runs in its own session/process group with the given extra env (NCCL variables go
  here, never into the runner's own environment). Inherited NCCL_* variables are dropped, so the
  NCCL profile alone decides them -- except NCCL_NVLS_ENABLE, a host-safety setting that is kept --
  and so are SGLANG_SIMULATE_ACC_* (forced acceptance comes from spec.simulate_accept_len only) and
  SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (engine.pcie_ipc_allreduce only).
- The health loop polls the process every iteration: a server that exits during start fails the job
  at once (not at the timeout), with the last lines of its log in the error.
- Exit, exceptions and Ctrl-C all kill the tree: SIGTERM to the group and every descendant found by
  psutil, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import requests

# Inherited variables the job's config alone decides: NCCL_* (the NCCL profile), SGLang's forced
# acceptance (spec.simulate_accept_len; an inherited one would silently make outputs not lossless) and
# SGLang's PCIe-IPC all-reduce switch (engine.pcie_ipc_allreduce; inherited, it would replace NCCL for
# decode and turn the nccl= axis into a no-op).
DROPPED_PREFIXES = ("NCCL_", "SGLANG_SIMULATE_ACC_", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")
# Inherited NCCL variables that survive the drop: machine-safety settings an operator sets for every
# NCCL process on the host (NVLink multicast can take shared GPUs out of service), never tuning.
KEPT_NCCL = ("NCCL_NVLS_ENABLE",)


class ServerError(RuntimeError):
    """The server failed to start or died; the message carries the tail of its log."""


class PortTaken(ServerError):
    """Another process took the port between our check and the server's bind (two sweeps at once)."""


def port_is_free(host: str, port: int) -> bool:
    """Free for a server: nobody listens there. SO_REUSEADDR as servers set it, so connections of
    an earlier server lingering in TIME_WAIT do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def choose_port(host: str, wanted: int) -> int:
    """The configured port if free, else a free one (0 means: any free port)."""
    if wanted and port_is_free(host, wanted):
        return wanted
    return free_port(host)


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no server log)"
    return "\n".join(text[-lines:])


def server_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_PREFIXES) or k in KEPT_NCCL}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def kill_tree(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM the process, its group and all descendants; SIGKILL whatever outlives the grace."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.send_signal(signal.SIGCONT)  # a stopped (SIGSTOP) process cannot act on SIGTERM
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    psutil.wait_procs(alive, timeout=grace_s)


class ServerProcess:
    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        log_path: Path,
        host: str,
        port: int,
        startup_timeout_s: float = 600.0,
        health_path: str = "/health",
    ):
        self.argv = argv
        self.extra_env = env
        self.log_path = Path(log_path)
        self.host, self.port = host, port
        self.startup_timeout_s = startup_timeout_s
        self.health_path = health_path
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> ServerProcess:
        if self.proc is None:
            self.start()
        return self

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab", buffering=0)
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.argv, env=server_env(self.extra_env), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as e:
            log.close()
            raise ServerError(f"cannot start {self.argv[0]!r}: {e}") from None
        log.close()
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.startup_timeout_s
        session = requests.Session()
        delay = 0.05
        foreign = False  # another process answered on our port
        while True:
            code = self.proc.poll()
            if code is not None:
                tail = log_tail(self.log_path)
                if foreign or "address already in use" in tail.lower() or not port_is_free(self.host, self.port):
                    raise PortTaken(f"port {self.port} was taken by another process during start-up")
                raise ServerError(
                    f"server exited with code {code} during start-up; last lines of {self.log_path}:\n"
                    + log_tail(self.log_path)
                )
            try:
                r = session.get(self.base_url + self.health_path, timeout=2)
                # Healthy only if the answer comes from our own process tree: another server may
                # hold the port while ours is still loading (and about to fail its bind).
                if r.status_code == 200:
                    if self.owns_port():
                        return
                    foreign = True
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"server not healthy after {self.startup_timeout_s:.0f}s "
                    f"(engine.startup_timeout_s); last lines of {self.log_path}:\n" + log_tail(self.log_path)
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)

    def owns_port(self) -> bool:
        """Whether a process of our server's tree listens on the port."""
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return False
        for p in procs:
            try:
                conns = p.net_connections(kind="inet")
            except (psutil.Error, OSError):
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port for c in conns):
                return True
        return False

    def check_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise ServerError(
                f"server exited with code {code}; last lines of {self.log_path}:\n" + log_tail(self.log_path)
            )

    def environ(self) -> dict[str, str]:
        """The server process's environment as it really is (read back from /proc)."""
        try:
            return psutil.Process(self.pid).environ()
        except (psutil.Error, OSError):
            return {}

    def environ_tree(self) -> dict[int, dict[str, str]]:
        """{pid: environment} of every process of the server's tree: with tensor parallelism each
        rank is its own process, and each must carry the NCCL profile."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return {}
        out = {}
        for p in procs:
            try:
                out[p.pid] = p.environ()
            except (psutil.Error, OSError):
                continue
        return out

    def stop(self) -> None:
        if self.proc is None:
            return
        kill_tree(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __exit__(self, *exc) -> None:
        self.stop()
