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
- Exit, exceptions and Ctrl-C all stop the server the way SGLang stops itself (``shutdown``): SIGTERM
  to the launcher only (SGLang's graceful path: drain, ``ShutdownReq``, up to 15 s, then it kills and
  reaps its children for up to 60 s; tokenizer_manager.py 2455, 3508-3559), a wait of up to
  ``engine.shutdown_grace_s`` for the launcher and every process of its tree and group to exit (what a
  dead launcher left behind gets SIGTERM then, as SGLang's launcher would have sent it), then
  SIGKILL to the group and whatever of the tree is left, and a wait until none is left -- and, where
  ``nvidia-smi`` exists, until no GPU lists one of them -- before the next launch may start.
  SIGTERM to all at once (the old way) made SGLang's watchdog SIGKILL the rest (utils/watchdog.py 181, 203-222).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

# Inherited variables the job's config alone decides: NCCL_* (the NCCL profile), SGLang's forced acceptance
# (spec.simulate_accept_len; inherited, outputs would silently not be lossless) and its PCIe-IPC all-reduce
# switch (engine.pcie_ipc_allreduce; inherited, it would replace NCCL for decode: the nccl= axis a no-op).
DROPPED_PREFIXES = ("NCCL_", "SGLANG_SIMULATE_ACC_", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")
# Inherited NCCL variables that survive the drop: machine safety (NVLink multicast can take shared GPUs
# out of service), never tuning; and NVIDIA images' label of the NCCL they ship, which NCCL never reads.
PASSED_THROUGH = ("NCCL_NVLS_ENABLE", "NCCL_VERSION")
SHUTDOWN_GRACE_S = 30.0  # SGLang's own drain: 15 s for ShutdownReq, then its reaping (>= 25 s)
KILL_WAIT_S = 10.0  # after SIGKILL: until the processes are gone (the kernel frees their memory)
GPU_WAIT_S = 60.0  # after that: until no GPU lists one of them (the driver frees its contexts)


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
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_PREFIXES) or k in PASSED_THROUGH}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group(pgid: int) -> list[psutil.Process]:
    """Live processes of the process group (orphans a dead launcher left behind keep it)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and _alive(p):
                out.append(p)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return out


def gpu_pids() -> set[int] | None:
    """PIDs holding a GPU context (``nvidia-smi --query-compute-apps``); None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {int(x) for x in out.split() if x.strip().isdigit()}


def _sigkill(pid: int, procs: list[psutil.Process]) -> list[int]:
    """SIGKILL the group and each of ``procs``; returns the pids that were alive to be killed."""
    alive = {p.pid: p for p in procs if _alive(p)}
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in alive.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return sorted(alive)


def shutdown(
    pid: int,
    grace_s: float = SHUTDOWN_GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
    gpu_wait_s: float = GPU_WAIT_S,
    reap=None,
) -> dict:
    """Stop a server started in its own session (pgid = ``pid``) as SGLang stops itself: SIGCONT to the
    group (a stopped process cannot act on SIGTERM), SIGTERM to the launcher only, wait up to
    ``grace_s`` until the launcher and every process of its tree and group have exited (its drain),
    SIGKILL the group and what is left of the tree, wait up to ``kill_wait_s`` until they are gone and
    then up to ``gpu_wait_s`` until no GPU lists one of them. ``reap``: called while waiting (the
    Popen's ``poll``, so our own child does not stay a zombie). Returns what happened."""
    t0 = time.monotonic()
    procs = _tree(pid)
    seen = {p.pid for p in procs}
    try:
        os.killpg(pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)

    def left() -> list[psutil.Process]:
        if reap is not None:
            reap()
        for p in list(procs):  # children started during the drain belong to it too
            if _alive(p):
                for c in _tree(p.pid)[1:]:
                    if c.pid not in seen:
                        seen.add(c.pid)
                        procs.append(c)
        return [p for p in procs if _alive(p)] or _group(pid)

    deadline = t0 + grace_s
    orphans_told = False
    while (alive := left()) and time.monotonic() < deadline:
        if not orphans_told and not (procs and _alive(procs[0])):
            # The launcher is gone (also: died and reaped before this stop) and left processes behind (our
            # embedded front dies at once on SIGTERM; SGLang's stops its children first): tell them.
            orphans_told = True
            for p in alive:
                try:
                    p.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    pass
        time.sleep(0.05)
    info: dict = {"drained": not alive, "drain_s": round(time.monotonic() - t0, 3), "killed": []}
    if alive:
        info["killed"] = _sigkill(pid, alive + _group(pid))
        deadline = time.monotonic() + kill_wait_s
        while (alive := left()) and time.monotonic() < deadline:
            time.sleep(0.05)
    info["gone"] = not alive
    gpus = gpu_pids()
    if gpus is None:
        info["gpus"] = "n/a (no nvidia-smi)"
    else:
        deadline = time.monotonic() + gpu_wait_s
        while (held := gpus & seen) and time.monotonic() < deadline:
            time.sleep(0.5)
            gpus = gpu_pids() or set()
        info["gpus"] = f"still held by {sorted(held)}" if held else "free of the server's processes"
    info["stop_s"] = round(time.monotonic() - t0, 3)
    return info


def kill_tree(pid: int, grace_s: float = 5.0) -> None:
    """Force: SIGTERM the process, its group and all descendants; SIGKILL whatever outlives the grace.
    (Not the runner's stop, which is ``shutdown``: for a server already failing, and for tests.)"""
    procs = _tree(pid)
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
    _sigkill(pid, alive)
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
        shutdown_grace_s: float = SHUTDOWN_GRACE_S,
        on_spawn=None,  # called with the launcher's pid right after it is spawned (runner: benchmark.server_cpus)
    ):
        self.argv = argv
        self.extra_env = env
        self.log_path = Path(log_path)
        self.host, self.port = host, port
        self.startup_timeout_s = startup_timeout_s
        self.health_path = health_path
        self.shutdown_grace_s, self.on_spawn = shutdown_grace_s, on_spawn
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None
        self.stopped: dict | None = None  # shutdown()'s account of the last stop

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
        self.stopped = None
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=server_env(self.extra_env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            log.close()
            raise ServerError(f"cannot start {self.argv[0]!r}: {e}") from None
        log.close()
        try:
            if self.on_spawn is not None:
                self.on_spawn(self.proc.pid)
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        import requests  # lazy: ~50 ms of CPU that a run.py stopping before its first launch never needs

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
        """Stop the server (``shutdown``): once; a second call (``__exit__`` after a failed start)
        finds nothing left to do."""
        if self.proc is None or self.stopped is not None:
            return
        self.stopped = shutdown(self.proc.pid, self.shutdown_grace_s, reap=self.proc.poll)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __exit__(self, *exc) -> None:
        self.stop()
