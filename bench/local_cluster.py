"""A local Redis Cluster for the tests and bench.scale: 6 ``redis-server`` processes (3
primaries, 3 replicas) from the same binary as the machine's Redis, on free ports, made a
cluster by ``redis-cli --cluster create``; nothing kept on disk."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import closing
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster

NODES = 6


def _free_pair() -> int:
    """A port p such that p and its cluster bus port p + 10000 are both free now."""
    for _ in range(200):
        with closing(socket.socket()) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with closing(socket.socket()) as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of ports for a Redis Cluster node")


class LocalCluster:
    """``start`` it, read ``url`` (every node, comma-separated: the client starts from any
    that answers and discovers the others), ``stop``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports: list[int] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return ",".join(f"redis://127.0.0.1:{port}/0" for port in self.ports)

    def start(self, timeout_s: float = 30) -> LocalCluster:
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server and redis-cli are needed (Debian: redis-server)")
        while len(self.ports) < NODES:
            port = _free_pair()
            if port not in self.ports:
                self.ports.append(port)
        for port in self.ports:
            self.start_node(port)
        for port in self.ports:
            self._wait_ping(port, timeout_s)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "1",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=timeout_s,
        )  # fmt: skip
        self.wait_healthy(timeout_s)
        self.wait_replicas_in_sync(timeout_s)
        return self

    def wait_replicas_in_sync(self, timeout_s: float = 30) -> None:
        """Every replica has its primary's data (a replica that never synced does not take
        over a failed primary)."""
        deadline = time.monotonic() + timeout_s
        for port, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            while True:
                info = redis.Redis(port=port, socket_timeout=1).info("replication")
                if info["role"] != "slave" or info.get("master_link_status") == "up":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the replica on port {port} did not sync")
                time.sleep(0.05)

    def start_node(self, port: int) -> None:
        folder = self.folder / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no",
             "--repl-diskless-sync-delay", "0"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

    @staticmethod
    def _wait_ping(port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if redis.Redis(port=port, socket_timeout=1).ping():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start")
            time.sleep(0.05)

    def wait_healthy(self, timeout_s: float = 30) -> None:
        """Every node sees the cluster as ok with all 16384 slots served."""
        deadline = time.monotonic() + timeout_s
        while True:
            infos = []
            for port, proc in self.procs.items():
                if proc.poll() is not None:
                    continue
                try:
                    infos.append(redis.Redis(port=port, socket_timeout=1).cluster("info"))
                except redis.RedisError:
                    infos.append({})
            if infos and all(
                i.get("cluster_state") == "ok" and int(i.get("cluster_slots_ok", 0)) == 16384
                for i in infos
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster did not become healthy: {infos}")
            time.sleep(0.1)

    def client(self) -> RedisCluster:
        nodes = [ClusterNode("127.0.0.1", p) for p in self.ports]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=nodes)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
        for proc in self.procs.values():
            proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
