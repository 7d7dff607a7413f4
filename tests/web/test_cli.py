"""CLI dispatch: subcommand flags reach their owner; unknown flags elsewhere are refused."""
from __future__ import annotations

import pytest

from parley.cli import main


def test_client_flags_pass_through_to_the_desktop_client(capsys: pytest.CaptureFixture[str]) -> None:
    # No sound card on CI machines: the client lists none and says what to do, with exit 0.
    assert main(["client", "--list-devices"]) == 0
    out = capsys.readouterr().out
    assert "audio devices" in out.lower()


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
