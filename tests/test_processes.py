"""runtime.shell without Ray: buffer, environment, secrets, groups, sandbox."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from coterie.runtime.errors import ToolError
from coterie.runtime.shell import (
    SAFE_PATH,
    LocalProcesses,
    OutputBuffer,
    ProcessHandle,
    Redactor,
    Sandbox,
    StartSpec,
    bwrap_available,
    group_alive,
    load_secrets,
    read_dotenv,
    scrubbed_env,
)


def spec(command: str, tmp_path: Path, **kw: object) -> StartSpec:
    return StartSpec(
        command=command,
        argv=["/bin/sh", "-c", command],
        cwd=str(tmp_path),
        env=scrubbed_env(home=tmp_path),
        **kw,  # type: ignore[arg-type]
    )


def alive(proc: psutil.Process) -> bool:
    """Still running (a zombie has exited; a reused pid is another process)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``cond`` every 0.05 s until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def tree_of(pid: int) -> list[psutil.Process]:
    """The live descendants of ``pid`` (empty once it is gone)."""
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if alive(p)]
    except psutil.NoSuchProcess:
        return []


def named(procs: list[psutil.Process], name: str) -> list[psutil.Process]:
    out: list[psutil.Process] = []
    for p in procs:
        try:
            if p.name() == name:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


# -- buffer -----------------------------------------------------------------


def test_buffer_offsets_and_dropped_bytes() -> None:
    buf = OutputBuffer(cap=10)
    buf.append(b"hello ")
    assert buf.read(0) == (b"hello ", 6, 0)
    assert buf.read(6) == (b"", 6, 0)
    buf.append(b"world!!")  # 13 bytes total, 3 rolled out
    chunk, nxt, dropped = buf.read(0)
    assert (chunk, nxt, dropped) == (b"lo world!!", 13, 3)
    assert buf.read(6) == (b"world!!", 13, 0)
    assert buf.read(None) == (b"lo world!!", 13, 0)
    assert buf.read(99) == (b"", 13, 0)


def test_buffer_flood_stays_within_cap() -> None:
    buf = OutputBuffer()
    for _ in range(2000):
        buf.append(b"x" * 1000)
    buf.append(b"y" * 200_000)  # a single chunk larger than the cap
    assert len(buf) == 64 * 1024 and buf.end == 2_200_000
    chunk, nxt, dropped = buf.read(0)
    assert len(chunk) == 64 * 1024 and nxt == 2_200_000 and dropped == 2_200_000 - 65536
    assert set(chunk) == {ord("y")}


# -- environment and secrets ------------------------------------------------


def test_env_is_an_allowlist() -> None:
    parent = {"PATH": "/evil", "AWS_SECRET_ACCESS_KEY": "x", "LANG": "de_DE.UTF-8", "TZ": "UTC"}
    env = scrubbed_env(
        home="/ws",
        parent=parent,
        extra={
            "PATH": "/x",
            "LD_PRELOAD": "/x.so",
            "DYLD_X": "1",
            "ld_library_path": "/x",
            "A": "1",
        },
    )
    assert env == {"PATH": SAFE_PATH, "HOME": "/ws", "LANG": "de_DE.UTF-8", "TZ": "UTC", "A": "1"}


def test_env_overrides_secret_of_same_name() -> None:
    env = scrubbed_env(home="/ws", parent={}, secrets={"K": "secret"}, extra={"K": "mine"})
    assert env["K"] == "mine"


def test_secrets_from_dotenv(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "# c\nexport TOKEN='abc def'\nOTHER=1\nbad line\nQ=\"x=y\"\n", encoding="utf-8"
    )
    assert read_dotenv(tmp_path / ".env") == {"TOKEN": "abc def", "OTHER": "1", "Q": "x=y"}
    assert load_secrets(tmp_path, ["TOKEN"], "ana") == {"TOKEN": "abc def"}
    with pytest.raises(ToolError) as err:
        load_secrets(tmp_path, ["TOKEN", "NOPE", "ALSO"], "ana")
    assert err.value.kind == "missing_secret" and "NOPE, ALSO" in err.value.detail
    assert "abc" not in err.value.detail
    with pytest.raises(ToolError):
        load_secrets(None, ["TOKEN"], "ana")


def test_redactor_handles_split_values() -> None:
    red = Redactor({"TOKEN": "s3cr3t-value"})
    out = red.feed(b"key=s3cr") + red.feed(b"3t-va") + red.feed(b"lue done s") + red.flush()
    assert out == b"key=[redacted:TOKEN] done s"
    assert Redactor({}).feed(b"abc") == b"abc"


async def test_secret_never_reaches_output(tmp_path: Path) -> None:
    s = spec('echo "$TOKEN"; printf %s "$TOKEN" | rev', tmp_path)
    s.env["TOKEN"] = "hunter2-secret"
    s.secrets = {"TOKEN": "hunter2-secret"}
    h = ProcessHandle(s)
    await h.start()
    assert await h.wait(10)
    text = h.read(0).chunk
    assert "hunter2-secret" not in text and "[redacted:TOKEN]" in text


async def test_parent_secrets_not_inherited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COTERIE_TEST_SECRET", "leak")
    h = ProcessHandle(spec("env", tmp_path))
    await h.start()
    assert await h.wait(10)
    out = h.read(0).chunk
    assert "leak" not in out and f"HOME={tmp_path}" in out


# -- processes ----------------------------------------------------------------


async def test_exit_code_merged_output_and_stdin(tmp_path: Path) -> None:
    h = ProcessHandle(spec("read line; echo got $line; echo err >&2; exit 3", tmp_path))
    await h.start()
    assert not await h.wait(0.2)
    await h.write(b"hello\n")
    assert await h.wait(10)
    r = h.read(0)
    assert r.exit_code == 3 and r.chunk == "got hello\nerr\n" and not r.running
    with pytest.raises(ToolError):
        await h.write(b"late\n")


def running_sleep(h: ProcessHandle) -> Callable[[], bool]:
    """Whether ``sh -c "sleep …"`` has become (or started) its ``sleep``.

    A signal sent while the shell is still starting can be held back from the
    command it then runs; tests that signal the command wait for it first.
    """

    def check() -> bool:
        if h.pid is None:
            return False
        try:
            me = psutil.Process(h.pid)
            return me.name() == "sleep" or bool(named(tree_of(h.pid), "sleep"))
        except psutil.NoSuchProcess:
            return False

    return check


async def test_signals_allowlist(tmp_path: Path) -> None:
    h = ProcessHandle(spec("sleep 30", tmp_path))
    await h.start()
    await until(running_sleep(h), "the sleep to start")
    with pytest.raises(ToolError) as err:
        h.signal("stop")
    assert err.value.kind == "invalid_arguments"
    assert h.signal("int")
    assert await h.wait(15)
    assert h.exit_code == -2 or h.exit_code == 130
    assert not h.signal("term")  # gone


async def test_int_works_when_the_runtime_ignores_it(tmp_path: Path) -> None:
    import signal

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        h = ProcessHandle(spec("sleep 30", tmp_path))
        await h.start()
    finally:
        signal.signal(signal.SIGINT, old)
    await until(running_sleep(h), "the sleep to start")
    assert h.signal("int") and await h.wait(15)


async def test_group_kill_reaches_children(tmp_path: Path) -> None:
    # The sleeps do not hold the output pipe, so only a kill of the group ends them.
    h = ProcessHandle(spec("sleep 100 >/dev/null 2>&1 & sleep 100 >/dev/null 2>&1", tmp_path))
    await h.start()
    shell = h.pid
    assert shell is not None
    await until(lambda: len(named(tree_of(shell), "sleep")) == 2, "both sleeps to start")
    kids = tree_of(shell)
    assert len(kids) == 2
    await h.stop(grace=2)
    assert not h.running
    await until(lambda: not any(alive(k) for k in kids), "the group's children to die")


async def test_term_ignored_is_escalated_to_kill(tmp_path: Path) -> None:
    h = ProcessHandle(spec("trap '' TERM; sleep 100 >/dev/null 2>&1", tmp_path))
    await h.start()
    shell = h.pid
    assert shell is not None
    # The shell must have set its trap and started sleep (which inherits the
    # ignored TERM) before the stop, or there would be nothing to escalate on.
    await until(lambda: len(named(tree_of(shell), "sleep")) == 1, "the sleep child to start")
    kids = tree_of(shell)
    assert [k.name() for k in kids] == ["sleep"]
    started = time.monotonic()
    await h.stop(grace=0.5)
    assert h.finished.is_set() and h.exit_code == -9
    assert time.monotonic() - started < 5
    await until(lambda: not any(alive(k) for k in kids), "the TERM-ignoring sleep to die")


async def test_timeout_kills(tmp_path: Path) -> None:
    # Long enough that "start" is printed even on a loaded machine.
    h = ProcessHandle(spec("echo start; sleep 100", tmp_path, timeout_s=2))
    await h.start()
    assert await h.wait(10)
    st = h.read(0)
    assert st.timed_out and st.chunk == "start\n" and st.exit_code == -15


async def test_local_service_list_remove(tmp_path: Path) -> None:
    svc = LocalProcesses(bwrap=None)
    pid = await svc.start(spec("sleep 100", tmp_path))
    assert pid.startswith("bg_") and [p.id for p in await svc.list()] == [pid]
    status = await svc.remove(pid)
    assert not status.running and await svc.list() == []
    with pytest.raises(ToolError) as err:
        await svc.status(pid)
    assert err.value.kind == "not_found"


# -- sandbox ------------------------------------------------------------------


def persona_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    home = tmp_path / "home"
    pdir = home / "personas" / "ana"
    ws = pdir / "workspace"
    ws.mkdir(parents=True)
    (pdir / ".env").write_text("TOKEN=zzz\n", encoding="utf-8")
    other = home / "personas" / "bob"
    other.mkdir(parents=True)
    (other / "notes.txt").write_text("bob's", encoding="utf-8")
    return home, pdir, ws


def test_bwrap_forced_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COTERIE_BWRAP", "0")
    assert bwrap_available() is None
    assert LocalProcesses().sandboxed is False
    argv = Sandbox(tmp_path, "readonly").argv("echo hi", tmp_path)
    assert argv == ["/bin/sh", "-c", "echo hi"]


@pytest.mark.needs("bubblewrap")
@pytest.mark.parametrize("access", ["workspace", "readonly"])
async def test_bwrap_confines(tmp_path: Path, access: str) -> None:
    home, pdir, ws = persona_tree(tmp_path)
    box = Sandbox(ws, access, pdir, home, bwrap_available())  # type: ignore[arg-type]
    script = (
        "echo hi > out.txt && echo wrote; "
        f"cat {pdir}/.env || echo noenv; ls {home}/personas/bob || echo nobob; "
        "echo \"tmp=$(ls -A /tmp | tr '\\n' /)\"; echo pid=$$"
    )
    s = StartSpec(command=script, argv=box.argv(script, ws), cwd=str(ws), env=scrubbed_env(home=ws))
    # Something in the real /tmp that a private /tmp must not show.
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="coterie-outside-"):
        h = ProcessHandle(s)
        await h.start()
        assert await h.wait(20)
    out = h.read(0).chunk
    assert h.exit_code == 0
    lines = out.splitlines()
    assert "zzz" not in out and "noenv" in lines and "bob's" not in out and "nobob" in lines
    # A private, empty /tmp: only the path bwrap made to bind the workspace back.
    entries = [str(ws).split("/")[2]] if str(ws).startswith("/tmp/") else []
    assert "tmp=" + "".join(f"{e}/" for e in entries) in lines
    assert re.search(r"^pid=[12]$", out, re.MULTILINE)  # its own pid namespace
    if access == "readonly":
        assert "wrote" not in out and not (ws / "out.txt").exists()
    else:
        assert "wrote" in out and (ws / "out.txt").read_text() == "hi\n"


@pytest.mark.needs("bubblewrap")
async def test_bwrap_group_kill(tmp_path: Path) -> None:
    _, pdir, ws = persona_tree(tmp_path)
    box = Sandbox(ws, "workspace", pdir, None, bwrap_available())
    cmd = "trap '' TERM; sleep 100 & sleep 100"
    h = ProcessHandle(
        StartSpec(command=cmd, argv=box.argv(cmd, ws), cwd=str(ws), env=scrubbed_env(home=ws))
    )
    await h.start()
    leader = h.pid
    assert leader is not None
    # bwrap, its pid-namespace init, the shell and both sleeps.
    await until(lambda: len(named(tree_of(leader), "sleep")) == 2, "both sleeps to start")
    tree = tree_of(leader)
    assert len(named(tree, "sleep")) == 2
    # The command leads its own group, and everything in the sandbox is in it.
    assert os.getpgid(leader) == leader != os.getpgid(os.getpid())
    assert all(os.getpgid(p.pid) == leader for p in tree)
    await h.stop(grace=0.5)  # bwrap dies of the TERM; the sleeps ignore it
    assert not h.running
    await until(lambda: not any(alive(p) for p in tree), "the sandboxed group to die")


async def test_no_signal_once_the_group_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After the shell is reaped with nobody left in its group, the group's id
    # may belong to another process: nothing may be sent to it any more.
    h = ProcessHandle(spec("true", tmp_path))
    await h.start()
    assert await h.wait(10) and h.exit_code == 0
    assert h.pid is not None
    await until(lambda: not group_alive(h.pid or 0), "the group to empty")
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    assert h.signal("term") is False
    await h.stop()
    await h.close()
    assert sent == []


async def test_group_alive_follows_the_members(tmp_path: Path) -> None:
    h = ProcessHandle(spec("sleep 100 >/dev/null 2>&1 & exec sleep 100", tmp_path))
    await h.start()
    assert h.pid is not None
    assert group_alive(h.pid)
    await h.stop(grace=0.5)
    await until(lambda: not group_alive(h.pid or 0), "every member to be gone")


# ---------------------------------------------------------------- network rails


def test_sandbox_network_flag(tmp_path: Path) -> None:
    # Built from the service, as tools/shell.py does; no bwrap needed to build argv.
    choice = LocalProcesses(bwrap="/usr/bin/bwrap")
    closed = choice.sandbox(tmp_path, "workspace", None, None)
    opened = choice.sandbox(tmp_path, "workspace", None, None, network=True)
    assert closed.network is False and opened.network is True
    assert "--unshare-net" in closed.argv("true", tmp_path)
    assert "--unshare-net" not in opened.argv("true", tmp_path)
    # Unconfined, nothing changes: there is no namespace to give or withhold.
    loose = LocalProcesses(bwrap=None)
    for network in (False, True):
        box = loose.sandbox(tmp_path, "workspace", None, None, network=network)
        assert box.argv("true", tmp_path) == ["/bin/sh", "-c", "true"]


def connect_probe(port: int) -> str:
    """A shell command connecting to 127.0.0.1:``port``: prints ``connected``,
    or ``no-connect <error>`` and exits 3 (127 would mean python3 is missing)."""
    import shlex  # here, not at the top: these tests were appended to the file

    code = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), 2).close()\n"
        "except OSError as exc:\n"
        "    print('no-connect', type(exc).__name__)\n"
        "    sys.exit(3)\n"
        "print('connected')\n"
    )
    return f"python3 -c {shlex.quote(code)}"


@pytest.mark.needs("bubblewrap")
async def test_bwrap_has_no_network_unless_allowed(tmp_path: Path) -> None:
    import socket

    _, pdir, ws = persona_tree(tmp_path)
    # A port of "the runtime" on loopback (Ray's are there too); the backlog
    # completes the connection without anyone calling accept().
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        command = connect_probe(listener.getsockname()[1])
        outcomes: dict[bool, tuple[int | None, str]] = {}
        for network in (False, True):
            box = Sandbox(ws, "workspace", pdir, None, bwrap_available(), network=network)
            h = ProcessHandle(
                StartSpec(
                    command=command,
                    argv=box.argv(command, ws),
                    cwd=str(ws),
                    env=scrubbed_env(home=ws),
                )
            )
            await h.start()
            assert await h.wait(20)
            outcomes[network] = (h.exit_code, h.read(0).chunk)
            await h.close()
    code, out = outcomes[False]
    assert code == 3 and out.startswith("no-connect "), out
    assert outcomes[True] == (0, "connected\n")


def test_dotenv_is_read_again_only_once_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coterie.runtime.shell import env as env_module

    dotenv = tmp_path / ".env"
    reads: list[Path] = []
    real_read_text = Path.read_text

    def counting(self: Path, *args: Any, **kwargs: Any) -> str:
        if self == dotenv:
            reads.append(self)
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    # A file changed in the last 2 s is read every time (two same-size writes
    # in one tick of the kernel's clock keep its stamp); that is checked last,
    # on a real fresh file. The rest treats every file as settled.
    monkeypatch.setattr(env_module, "_DOTENV_SETTLED_NS", 0)
    dotenv.write_text("TOKEN=first-value\n", encoding="utf-8")
    assert read_dotenv(dotenv) == {"TOKEN": "first-value"}
    assert read_dotenv(dotenv) == {"TOKEN": "first-value"}
    assert len(reads) == 1  # unchanged: not read again
    got = read_dotenv(dotenv)
    got["TOKEN"] = "mutated by a caller"
    assert read_dotenv(dotenv) == {"TOKEN": "first-value"}  # callers get copies
    dotenv.write_text("TOKEN=longer-value\n", encoding="utf-8")  # another size
    assert read_dotenv(dotenv) == {"TOKEN": "longer-value"}
    renamed = tmp_path / "new.env"  # an editor's save: the same size, a new inode
    renamed.write_text("TOKEN=second-value\n", encoding="utf-8")
    renamed.replace(dotenv)
    assert read_dotenv(dotenv) == {"TOKEN": "second-value"}
    dotenv.unlink()
    assert read_dotenv(dotenv) == {}
    monkeypatch.setattr(env_module, "_DOTENV_SETTLED_NS", 2_000_000_000)
    dotenv.write_text("TOKEN=fresh-value\n", encoding="utf-8")
    before = len(reads)
    assert read_dotenv(dotenv) == {"TOKEN": "fresh-value"}
    assert read_dotenv(dotenv) == {"TOKEN": "fresh-value"}
    assert len(reads) == before + 2  # changed < 2 s ago: read every time
