"""CLI dispatch: subcommand flags reach their owner; unknown flags elsewhere are refused."""
from __future__ import annotations

import pytest

from cli.main import main


def test_client_flags_pass_through_to_the_desktop_client(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from desktop import audio_io

    monkeypatch.setattr(audio_io, "list_devices", lambda: [audio_io.DeviceInfo(7, "Test Mic", 1, 0, 48000.0)])
    assert main(["client", "--list-devices"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["7", "1", "0", "48000", "Test", "Mic"]


def test_unknown_flag_for_other_commands_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["models", "--bogus"])
    assert info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_client_help_is_the_clients_own(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["client", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--server" in out and "--push-to-talk" in out


def test_client_flags_with_values_keep_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    import desktop.main

    seen: list[list[str]] = []
    monkeypatch.setattr(desktop.main, "main", lambda cfg, rest: seen.append(list(rest)) or 0)
    assert main(["--set", "server.port=8123", "client", "--server", "127.0.0.1:9", "--token", "t", "--headphones"]) == 0
    assert seen == [["--server", "127.0.0.1:9", "--token", "t", "--headphones"]]
