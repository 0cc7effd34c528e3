"""mcp.json: parsing, errors naming file/server/field, merging, launches."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest

from coterie.runtime.config import load_persona
from coterie.runtime.errors import PersonaConfigError, ToolError
from coterie.runtime.mcp.config import (
    McpConfigError,
    launch_for,
    load_servers,
    parse_mcp_config,
    read_mcp_file,
)
from tests.helpers import scripted, write_persona


def write_config(folder: Path, servers: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


def problems(raw: object, tmp_path: Path) -> str:
    with pytest.raises(McpConfigError) as info:
        parse_mcp_config(raw, path=tmp_path / "mcp.json")
    return str(info.value)


def test_stdio_and_http_servers_parse(tmp_path: Path) -> None:
    cfg = parse_mcp_config(
        {
            "mcpServers": {
                "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
                "remote": {
                    "type": "streamable-http",
                    "url": "http://127.0.0.1:9000/mcp",
                    "headers": {"Authorization": "Bearer ${secret:TOKEN}"},
                    "timeout": 5,
                },
            }
        },
        path=tmp_path / "mcp.json",
    )
    time, remote = cfg.mcpServers["time"], cfg.mcpServers["remote"]
    assert time.transport == "stdio" and time.args == ["--local-timezone", "UTC"]
    assert time.timeout == 60 and time.cwd == "workspace"
    assert remote.transport == "http" and remote.timeout == 5


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ({"command": "x", "colour": "red"}, "server 'bad', field 'colour': unknown field"),
        ({"args": ["a"]}, "server 'bad': a stdio server needs 'command'"),
        ({"type": "sse", "url": "http://h/sse"}, "the SSE transport is not supported"),
        ({"url": "ftp://h"}, "server 'bad', field 'url': expected an http:// or https:// URL"),
        ({"url": "http://h/mcp", "command": "x"}, "'command', 'args' and 'env' belong to stdio"),
        ({"command": "x", "headers": {"A": "b"}}, "'url' and 'headers' belong to HTTP servers"),
        ({"command": "x", "env": {"PATH": "/evil"}}, "PATH cannot be set"),
        ({"command": "x", "env": {"K": "${HOME}"}}, "only ${secret:NAME} and ${env:NAME}"),
        ({"command": "x", "timeout": 0}, "server 'bad', field 'timeout'"),
        (
            {"command": "x", "shared": True, "env": {"K": "${secret:K}"}},
            "a shared server cannot use ${secret:",
        ),
    ],
)
def test_a_wrong_entry_names_the_file_server_and_field(
    tmp_path: Path, server: dict[str, object], expected: str
) -> None:
    message = problems({"mcpServers": {"bad": server}}, tmp_path)
    assert str(tmp_path / "mcp.json") in message
    assert expected in message


def test_server_names_and_top_level_shape(tmp_path: Path) -> None:
    assert "server name 'a__b'" in problems({"mcpServers": {"a__b": {"command": "x"}}}, tmp_path)
    assert "server name 'a b'" in problems({"mcpServers": {"a b": {"command": "x"}}}, tmp_path)
    assert "(top level): expected a JSON object" in problems([1], tmp_path)
    assert "field 'servers': unknown field (servers go under 'mcpServers')" in problems(
        {"servers": {}}, tmp_path
    )


def test_unreadable_and_invalid_json_files(tmp_path: Path) -> None:
    assert read_mcp_file(tmp_path / "missing.json").mcpServers == {}
    path = tmp_path / "mcp.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(McpConfigError, match="not valid JSON"):
        read_mcp_file(path)


def test_the_error_is_a_persona_config_error_and_pickles(tmp_path: Path) -> None:
    with pytest.raises(PersonaConfigError) as info:
        parse_mcp_config({"mcpServers": {"x": {}}}, path=tmp_path / "mcp.json")
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, McpConfigError) and str(again) == str(info.value)
    assert str(again).startswith(f"invalid MCP configuration {tmp_path / 'mcp.json'}")


def test_the_persona_file_adds_and_replaces_and_disabled_drops(tmp_path: Path) -> None:
    persona_dir = write_persona(tmp_path, "p", scripted())
    write_config(
        tmp_path,
        {
            "time": {"command": "home-time"},
            "git": {"command": "git-server"},
            "off": {"command": "x", "disabled": True},
        },
    )
    write_config(persona_dir, {"time": {"command": "own-time"}, "mine": {"url": "http://h/mcp"}})
    servers = load_servers(tmp_path, persona_dir)
    assert sorted(servers) == ["git", "mine", "time"]
    assert servers["time"].config.command == "own-time"
    assert servers["time"].source == persona_dir / "mcp.json"
    assert servers["git"].source == tmp_path / "mcp.json"


def test_shared_belongs_in_the_home_file(tmp_path: Path) -> None:
    persona_dir = write_persona(tmp_path, "p", scripted())
    write_config(persona_dir, {"s": {"command": "x", "shared": True}})
    with pytest.raises(McpConfigError, match="shared servers belong in"):
        load_servers(tmp_path, persona_dir)


def test_a_launch_fills_secrets_and_scrubs_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-runtime-key")
    monkeypatch.setenv("REGION", "eu")
    persona_dir = write_persona(tmp_path, "p", scripted())
    (persona_dir / ".env").write_text("TOKEN=s3cret-token\n", encoding="utf-8")
    write_config(
        persona_dir,
        {
            "tool": {
                "command": "mcp-server-time",
                "env": {"API_TOKEN": "${secret:TOKEN}", "WHERE": "${env:REGION}", "PLAIN": "1"},
            },
            "web": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${secret:TOKEN}"}},
        },
    )
    servers = load_servers(tmp_path, persona_dir)
    workspace = persona_dir / "workspace"
    launch = launch_for(
        servers["tool"], persona_dir=persona_dir, workspace=workspace, logs=tmp_path / "logs"
    )
    assert launch.transport == "stdio"
    assert launch.env["API_TOKEN"] == "s3cret-token" and launch.env["WHERE"] == "eu"
    assert launch.env["PLAIN"] == "1"
    assert "OPENAI_API_KEY" not in launch.env and "REGION" not in launch.env
    assert launch.cwd == str(workspace) and launch.env["HOME"] == str(workspace)
    # A server installed next to coterie is found without a path.
    assert launch.command == str(Path(sys.executable).parent / "mcp-server-time")
    assert launch.stderr_log == str(tmp_path / "logs" / "tool.stderr.log")
    web = launch_for(
        servers["web"], persona_dir=persona_dir, workspace=workspace, logs=tmp_path / "logs"
    )
    assert web.headers == {"Authorization": "Bearer s3cret-token"}


def test_a_missing_secret_is_named(tmp_path: Path) -> None:
    persona_dir = write_persona(tmp_path, "p", scripted())
    write_config(persona_dir, {"tool": {"command": "x", "env": {"K": "${secret:NOPE}"}}})
    server = load_servers(tmp_path, persona_dir)["tool"]
    with pytest.raises(ToolError) as info:
        launch_for(server, persona_dir=persona_dir, workspace=None, logs=tmp_path)
    assert info.value.kind == "missing_secret"
    assert "MCP server 'tool' needs secret:NOPE" in info.value.detail


def test_cwd_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    persona_dir = write_persona(tmp_path, "p", scripted())
    write_config(tmp_path, {"a": {"command": "./bin/server", "cwd": "data"}})
    launch = launch_for(
        load_servers(tmp_path, persona_dir)["a"],
        persona_dir=persona_dir,
        workspace=persona_dir / "workspace",
        logs=tmp_path,
    )
    assert launch.cwd == str((tmp_path / "data").resolve())
    assert launch.command == str((tmp_path / "bin" / "server").resolve())


def test_mcp_gateway_is_a_persona_setting(tmp_path: Path) -> None:
    write_persona(tmp_path, "p", scripted(mcp_gateway=True))
    assert load_persona(tmp_path, "p").config.mcp_gateway is True
