"""A Harbor environment that runs a trial's commands on the host (test support, never shipped).

Harbor 0.25's built-in environments all need a container runtime or a cloud; the tests that drive
the real Harbor load this one with ``--env host_env:HostEnvironment`` (the directory of this file on
``PYTHONPATH``). It runs where Harbor runs: inside the Debian root of scripts/install-harbor.sh.

Each environment (one per trial) is a private mount namespace, held open by a ``sleep`` process,
in which the sandbox paths Harbor uses (``/logs``, ``/tests``, ``/solution``, ``/app``) are bind
mounts of a scratch directory of its own, so concurrent trials never see each other's files. Every
command runs in that namespace through ``nsenter``; the tmux server terminus-2 starts lives there
too, with its socket under the scratch directory (``TMUX_TMPDIR``), so every trial has its own tmux
server. ``stop`` kills every process in the namespace, as deleting a container would; when Harbor
itself is killed, nothing stops them: whoever ran Harbor must.
"""

import asyncio
import os
import shlex
import shutil
import signal
import tempfile
from pathlib import Path

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.trial.paths import EnvironmentPaths

# Sandbox paths bound to the scratch directory (Harbor's EnvironmentPaths plus the tasks' workdir).
SANDBOX_DIRS = ("logs", "tests", "solution", "app")
DEFAULT_WORKDIR = "/app"

# Runs in the new mount namespace: binds the sandbox paths, says so, then holds the namespace open.
HOLDER_SCRIPT = """
set -e
scratch=$1; shift
for d in "$@"; do
  mkdir -p "$scratch/$d" "/$d"
  mount --bind "$scratch/$d" "/$d"
done
echo ready
exec sleep infinity
"""


class HostEnvironment(BaseEnvironment):
    @staticmethod
    def type() -> str:
        return "host"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()

    def _validate_definition(self):
        # The host is the sandbox: there is no image to build or Dockerfile to check.
        pass

    # ------------------------------------------------------------------ lifecycle

    async def start(self, force_build: bool) -> None:
        self._scratch = Path(tempfile.mkdtemp(prefix=f"harbor-host-{self.session_id}-"))
        (self._scratch / "tmux").mkdir()
        self._holder = await asyncio.create_subprocess_exec(
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            HOLDER_SCRIPT,
            "sh",
            str(self._scratch),
            *SANDBOX_DIRS,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # Out of Harbor's process group, as a container is: a signal to Harbor's group (how
            # payload stops it) must not tear the sandbox down under Harbor's own wind-down.
            start_new_session=True,
        )
        line = await self._holder.stdout.readline()
        if line.strip() != b"ready":
            err = await self._holder.stderr.read()
            raise RuntimeError(f"host environment: mount namespace setup failed: {err.decode(errors='replace')}")
        self._namespace = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        # A container runtime mounts these; here they are plain directories of the scratch tree.
        paths = EnvironmentPaths.for_os(self.os)
        await self.ensure_dirs([paths.agent_dir, paths.verifier_dir, paths.artifacts_dir])

    async def stop(self, delete: bool):
        holder = getattr(self, "_holder", None)
        if holder is None:
            return
        # Like deleting a container: nothing started in the namespace outlives it.
        for pid in self._namespace_pids():
            if pid != holder.pid:
                _kill(pid)
        _kill(holder.pid)
        await holder.wait()
        self._holder = None
        if delete:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _namespace_pids(self) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == self._namespace:
                    pids.append(int(entry))
            except OSError:
                continue
        return pids

    # ------------------------------------------------------------------ commands

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        # `user` is not switched: the trials run as the one user Harbor runs as.
        full_env = {**os.environ, "TMUX_TMPDIR": str(self._scratch / "tmux"), **(self._merge_env(env) or {})}
        workdir = cwd or self.task_env_config.workdir or DEFAULT_WORKDIR
        proc = await asyncio.create_subprocess_exec(
            *self._enter(),
            "--",
            "/bin/bash",
            "-c",
            f"cd {shlex.quote(workdir)} && {{\n{command}\n}}",
            env=full_env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=timeout_sec)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            _kill_group(proc.pid)
            await proc.wait()
            raise
        return ExecResult(
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
            return_code=proc.returncode,
        )

    def _enter(self) -> list[str]:
        # Entering a mount namespace resets the root to the namespace's (the host's), not Harbor's
        # chroot: --root takes the holder's root again. (--wd resolves outside that root: callers cd.)
        return ["nsenter", f"--target={self._holder.pid}", "--mount", "--root"]

    async def _copy(self, source: str, target: str, *, contents: bool) -> None:
        # Inside the namespace: sandbox paths are the bind mounts, host paths are the same paths.
        src = f"{shlex.quote(source)}/." if contents else shlex.quote(source)
        parent = shlex.quote(target) if contents else f'"$(dirname {shlex.quote(target)})"'
        script = f"cd / && mkdir -p {parent} && cp -a {src} {shlex.quote(target)}"
        proc = await asyncio.create_subprocess_exec(
            *self._enter(),
            "--",
            "/bin/sh",
            "-c",
            script,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"copy {source} -> {target} failed: {stderr.decode(errors='replace').strip()}")

    # Host paths may be relative to Harbor's working directory; the copies run from "/".
    async def upload_file(self, source_path: Path | str, target_path: str):
        await self._copy(os.path.abspath(source_path), target_path, contents=False)

    async def upload_dir(self, source_dir: Path | str, target_dir: str):
        await self._copy(os.path.abspath(source_dir), target_dir, contents=True)

    async def download_file(self, source_path: str, target_path: Path | str):
        await self._copy(source_path, os.path.abspath(target_path), contents=False)

    async def download_dir(self, source_dir: str, target_dir: Path | str):
        await self._copy(source_dir, os.path.abspath(target_dir), contents=True)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
