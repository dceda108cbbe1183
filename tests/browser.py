"""A headless Chromium driven over the DevTools protocol (websockets), for the browser test.

    with Browser(tmp_path) as b:
        b.open("http://127.0.0.1:4200/runs")
        b.wait_for_text("curate", timeout=60)
        b.screenshot(tmp_path / "runs.png")

Only what the test needs: navigate, read the page's text, click by text, screenshot. Chromium runs with a
fresh profile and without background networking, QUIC, sync, component updates or a sandbox (containers).
`chromium()` finds Debian's `chromium` (or `chromium-browser`, `google-chrome`); None when absent.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1600,1000"]


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class Browser:
    def __init__(self, tmp: Path, binary: str | None = None) -> None:
        self.profile = Path(tmp) / "chromium-profile"
        self.binary = binary or chromium()
        self._ids = itertools.count(1)

    def __enter__(self) -> Browser:
        from websockets.sync.client import connect

        self.proc = subprocess.Popen([self.binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.time() + 180  # a busy machine starts it slowly
        while not port_file.exists() or not port_file.read_text().strip():
            if time.time() > deadline or self.proc.poll() is not None:
                self.proc.kill()  # (a slow start must not leave a browser behind)
                raise RuntimeError(f"{self.binary} did not start (no {port_file})")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(p for p in pages if p["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def eval(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def text(self) -> str:
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *needles: str, timeout: float = 60) -> str:
        deadline = time.time() + timeout
        while True:
            text = self.text()
            if all(n in text for n in needles):
                return text
            if time.time() > deadline:
                missing = [n for n in needles if n not in text]
                raise AssertionError(f"page never showed {missing}; it shows:\n{text[:3000]}")
            time.sleep(1)

    def click_text(self, text: str) -> bool:
        """Click the innermost element whose own text is ``text``; whether one was found."""
        js = ("(() => { const all = [...document.querySelectorAll('body *')].filter(e => "
              f"e.children.length === 0 && e.textContent.trim() === {json.dumps(text)}); "
              "if (!all.length) return false; all[0].click(); return true; })()")
        return bool(self.eval(js))

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)
