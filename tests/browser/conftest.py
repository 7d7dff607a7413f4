"""Browser-test fixtures: Debian chromium via Playwright with a fake microphone, the mock server, and one real
`parley serve` for both modules that talk to it (test_browser_e2e, test_browser_webrtc; each page has its own session).

Never runs `playwright install`; skips cleanly when /usr/bin/chromium or playwright is missing.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.parley_process import ParleyProcess
from browser_harness import ARTIFACTS, CHROMIUM, MockProcess, chromium_args, free_port, mic_wav, mock_server


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def playwright_instance() -> Iterator[object]:
    # Module scope, not session: while sync_playwright is open its event loop counts as running in
    # this thread, and every pytest-asyncio test collected after the browser tests would fail.
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture
def launch(playwright_instance) -> Iterator[object]:
    """launch(wav=None, fake_ui=True, autoplay=True, transport="ws") -> a new page in its own browser with that fake
    microphone, on the socket unless `transport="webrtc"` (the page's own default)."""
    browsers = []

    def _launch(wav: Path | None = None, *, fake_ui: bool = True, autoplay: bool = True, viewport: dict | None = None,
                transport: str = "ws", extra_args: tuple[str, ...] = ()):
        args = [*chromium_args(wav), *extra_args]
        if not fake_ui:
            args.remove("--use-fake-ui-for-media-stream")
        if not autoplay:  # the browser's default: sound only after a user gesture
            args.remove("--autoplay-policy=no-user-gesture-required")
        browser = playwright_instance.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        browsers.append(browser)
        context = browser.new_context(viewport=viewport or {"width": 1280, "height": 900},
                                      permissions=["microphone"] if fake_ui else [])
        if transport == "ws":  # the socket's tests: the page's default (WebRTC) would leave the socket path unused
            context.add_init_script("localStorage.setItem('parley.transport', 'ws')")
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.on("console", lambda m: print(f"[page {m.type}] {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: print(f"[page error] {e}"))
        return page

    yield _launch
    for b in browsers:
        b.close()


@pytest.fixture(scope="session")
def silent_wav(tmp_path_factory) -> Path:
    return mic_wav(tmp_path_factory.mktemp("wav") / "silent.wav", [("silence", 2000)])


@pytest.fixture
def mock(tmp_path: Path) -> Iterator[MockProcess]:
    server = mock_server(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[ParleyProcess]:
    """`parley serve` as `make run` starts it, its page's origin allowed (the port is chosen before the start)."""
    tmp = tmp_path_factory.mktemp("server")
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    sets = (f"server.trace_log={tmp / 'traces.jsonl'}", f"storage.url=sqlite:///{tmp / 'conversations.db'}", f"server.allowed_origins={json.dumps([origin])}")
    srv = ParleyProcess(tmp / "server.log", sets=sets, port=port)
    srv.start()
    yield srv
    srv.kill()
