"""Test hosts on one machine: network namespaces on a bridge, each with its own address and sshd.

Three namespaces (``hosts[0..2]``) hang off a bridge by veth pairs, on a private /24; each runs
Debian's sshd with a throw-away host key and lets in a throw-away client key. They share the file
system (as a cluster shares ``runs/`` over NFS), and sshd gives every session the environment the
test names (PYTHONPATH, GLUONTL_HOME), as a cluster's profile would. ``close`` tears down
everything — every process in a namespace, the namespaces, the bridge, the keys — also after a
failure. Needs root, iproute2, openssh-server and iptables (``.ci/run`` installs the last two).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
NEEDS = ("ip", "tc", "iptables", "ssh", "ssh-keygen")


def unavailable() -> str | None:
    """Why namespaces with sshd cannot be made here, None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [t for t in NEEDS if shutil.which(t) is None] + ([SSHD] if not os.path.exists(SSHD) else [])
    if missing:
        return f"missing {', '.join(missing)} (Debian: iproute2, iptables, openssh-server)"
    probe = f"gtlprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"this machine does not allow network namespaces ({made.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=60)


class Cluster:
    """``hosts`` (namespace names) with ``address[host]``; ``run_in(host, argv)`` starts a process there."""

    def __init__(self, folder: Path, env: dict[str, str], n: int = 3) -> None:
        tag = f"gtl{os.getpid() % 100000}"
        net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.folder, self.bridge, self.gateway = folder, f"{tag}br", f"{net}.1"
        self.hosts = [f"{tag}h{i}" for i in range(n)]
        self.address = {h: f"{net}.{11 + i}" for i, h in enumerate(self.hosts)}
        self.key = folder / "id_ed25519"
        self.sshd: list[subprocess.Popen] = []
        self.made_run_sshd = False
        try:
            self._up(env)
        except BaseException:
            self.close()
            raise

    def _up(self, env: dict[str, str]) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, h in enumerate(self.hosts):
            sh("ip", "netns", "add", h)
            sh("ip", "link", "add", f"{h}v", "type", "veth", "peer", "name", "eth0", "netns", h)
            sh("ip", "link", "set", f"{h}v", "master", self.bridge, "up")
            self.exec(h, "ip", "addr", "add", f"{self.address[h]}/24", "dev", "eth0")
            self.exec(h, "ip", "link", "set", "eth0", "up")
            self.exec(h, "ip", "link", "set", "lo", "up")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.folder / "host_key"))
        (self.folder / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        if not os.path.isdir("/run/sshd"):  # sshd's privilege-separation folder (its service makes it)
            os.makedirs("/run/sshd", mode=0o755)
            self.made_run_sshd = True
        config = self.folder / "sshd_config"
        config.write_text("\n".join([
            f"HostKey {self.folder / 'host_key'}", f"AuthorizedKeysFile {self.folder / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "PidFile none", "ClientAliveInterval 2", "ClientAliveCountMax 3",
            *(f"SetEnv {k}={v}" for k, v in env.items()), ""]))
        for h in self.hosts:
            self.sshd.append(subprocess.Popen(["ip", "netns", "exec", h, SSHD, "-D", "-e", "-f", str(config),
                                               "-o", f"ListenAddress={self.address[h]}"],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=open(self.folder / f"sshd-{h}.log", "w")))
        deadline = time.monotonic() + 30
        for h in self.hosts:  # sshd listens once its port answers (from the root namespace, over the bridge)
            while True:
                try:
                    socket.create_connection((self.address[h], 22), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, (self.folder / f"sshd-{h}.log").read_text()
                    time.sleep(0.05)

    def ssh(self) -> str:
        """The --ssh command that reaches the hosts with the throw-away key. Its ServerAlive probes
        (and sshd's ClientAlive ones) give up on a silent peer after 6 s rather than the default
        ssh's 15 s: the tests that take a link down wait that long for the job to end."""
        return (f"ssh -i {self.key} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                f"-o LogLevel=ERROR -o ServerAliveInterval=2 -o ServerAliveCountMax=3")

    def exec(self, host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", host, *cmd, check=check)

    def link(self, host: str, up: bool) -> None:
        sh("ip", "link", "set", f"{host}v", "up" if up else "down")

    def pids(self, host: str) -> list[int]:
        """Every process in the host's namespace (sshd included)."""
        out = sh("ip", "netns", "pids", host, check=False).stdout
        return [int(p) for p in out.split()]

    def close(self) -> None:
        for p in self.sshd:
            p.kill()
            p.wait()
        for h in self.hosts:
            for pid in self.pids(h):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            sh("ip", "netns", "del", h, check=False)  # its veth end goes with it, and the peer too
        sh("ip", "link", "del", self.bridge, check=False)
        for f in (self.key, Path(f"{self.key}.pub"), self.folder / "host_key", self.folder / "host_key.pub",
                  self.folder / "authorized_keys"):
            f.unlink(missing_ok=True)
        if self.made_run_sshd:
            shutil.rmtree("/run/sshd", ignore_errors=True)

    def namespaces(self) -> list[str]:
        return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()]
