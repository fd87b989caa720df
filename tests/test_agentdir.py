"""Per-run pi agent directories generated from the configuration, and finding pi."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.config import Config
from tether.errors import ConfigError
from tether.pi.agentdir import NO_KEY, provider_keys, write_agent_dir
from tether.pi.errors import PiNotInstalled
from tether.pi.install import find_pi, pi_argv


def config(**harness: object) -> Config:
    return Config.model_validate(
        {
            "providers": {
                "local": {
                    "base_url": "http://127.0.0.1:18080/v1",
                    "context_window": 8192,
                    "max_tokens": 1024,
                    "compat": {"supportsDeveloperRole": False},
                },
                "hosted": {
                    "base_url": "https://api.example.com/v1",
                    "api_key_env": "TETHER_TEST_KEY",
                    "context_window": 200_000,
                    "max_tokens": 8192,
                },
            },
            "agents": {
                "reviewer": {"provider": "local", "model": "smollm2", "effort": "off"},
                "thinker": {"provider": "hosted", "model": "big", "effort": "high"},
            },
            "harness": harness,
        }
    )


def test_models_and_settings_follow_the_config(tmp_path: Path) -> None:
    made = write_agent_dir(tmp_path / "agent", config(), "reviewer")
    models = json.loads((tmp_path / "agent" / "models.json").read_text())
    settings = json.loads((tmp_path / "agent" / "settings.json").read_text())
    provider = models["providers"]["local"]
    assert list(models["providers"]) == ["local"], "only the agent's provider"
    assert provider["baseUrl"] == "http://127.0.0.1:18080/v1"
    assert provider["compat"] == {"supportsDeveloperRole": False}
    (model,) = provider["models"]
    assert model["id"] == "smollm2"
    assert model["contextWindow"] == 8192
    assert model["maxTokens"] == 1024
    assert model["reasoning"] is False
    assert settings["defaultProvider"] == "local"
    assert settings["defaultModel"] == "smollm2"
    assert settings["defaultThinkingLevel"] == "off"
    compaction = settings["compaction"]
    assert 0 < compaction["keepRecentTokens"] <= 8192 // 4
    assert compaction["reserveTokens"] >= 1024
    assert made.env == {"PI_CODING_AGENT_DIR": str((tmp_path / "agent").resolve())}


def test_overrides_and_keys_stay_off_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(
        keep_recent_tokens=100, reserve_tokens=200, pi_settings={"retry": {"maxRetries": 1}}
    )
    with pytest.raises(ConfigError, match="TETHER_TEST_KEY"):
        write_agent_dir(tmp_path / "a", cfg, "thinker")
    monkeypatch.setenv("TETHER_TEST_KEY", "sk-secret")
    made = write_agent_dir(tmp_path / "b", cfg, "thinker")
    assert "sk-secret" not in json.dumps(made.env), "keys travel over the key channel only"
    assert provider_keys(cfg, "thinker") == {"hosted": "sk-secret"}
    text = (tmp_path / "b" / "models.json").read_text() + (
        tmp_path / "b" / "settings.json"
    ).read_text()
    assert "sk-secret" not in text
    models = json.loads((tmp_path / "b" / "models.json").read_text())
    assert models["providers"]["hosted"]["apiKey"] == NO_KEY
    settings = json.loads((tmp_path / "b" / "settings.json").read_text())
    assert settings["compaction"]["keepRecentTokens"] == 100
    assert settings["compaction"]["reserveTokens"] == 200
    assert settings["retry"] == {"maxRetries": 1}
    assert settings["defaultThinkingLevel"] == "high"


def test_pi_is_the_pinned_one_or_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pi = find_pi()
    assert pi.version == "1.6.0"
    assert "node_modules" in str(pi.node)
    argv = pi_argv(
        pi,
        session_file=Path("rel/session.jsonl"),
        provider="local",
        model="m",
        effort="off",
        tools=["read", "bash"],
        system_prompt="You review code.",
    )
    assert argv[:2] == [str(pi.node), str(pi.cli)]
    assert argv[argv.index("--session") + 1] == str(Path("rel/session.jsonl").resolve())
    assert argv[argv.index("--tools") + 1] == "read,bash"
    assert "--no-extensions" in argv
    monkeypatch.setenv("TETHER_NODE", str(tmp_path / "node"))
    with pytest.raises(PiNotInstalled, match="tether setup"):
        find_pi()


def test_public_names() -> None:
    import tether.harness
    import tether.mirror

    for module in (tether.harness, tether.mirror):
        assert len(set(module.__all__)) == len(module.__all__)
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
