"""Screenshots of the console's main pages, for docs/screenshots/ and the README.

    .venv/bin/python docs/screenshots.py [--out docs/screenshots]

Builds a throw-away SQLite database in a temporary directory (never the one in
DATABASE_URL), seeds it with ``manage.py seed_demo``, serves it with the development
server on a free local port, signs in as the demo people and photographs each page with
Playwright driving Debian's chromium (``/usr/bin/chromium``, as the browser tests do).
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1440, "height": 900}
PEOPLE = {
    "approver": "approver-demo",
    "support": "support-demo",
    "operator": "operator-demo",
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment(var_dir: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "EFFECTGATE_VAR_DIR"}
    }
    env.update({"EFFECTGATE_VAR_DIR": var_dir, "DEBUG": "1", "LOG_LEVEL": "WARNING"})
    return env


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(  # noqa: S603 (our own manage.py)
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True
    )


def _wait_for(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (our own local server)
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _sign_in(page: Page, username: str) -> None:
    page.context.clear_cookies()
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PEOPLE[username])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def _shoot(page: Page, out: Path, name: str) -> None:
    page.wait_for_load_state("networkidle")
    path = out / f"{name}.png"
    page.screenshot(path=str(path))
    print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def photograph(base_url: str, out: Path) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for scheme in ("light", "dark"):
            context = browser.new_context(base_url=base_url, viewport=VIEWPORT, color_scheme=scheme)
            page = context.new_page()
            if scheme == "dark":
                # One page is enough to show the dark scheme.
                _sign_in(page, "operator")
                page.goto("/dashboard/")
                _shoot(page, out, "dashboard-dark")
                context.close()
                continue

            _sign_in(page, "approver")
            _shoot(page, out, "inbox")
            page.locator("#inbox-rows tr").first.get_by_role("link").first.click()
            _shoot(page, out, "approval")

            _sign_in(page, "support")
            page.goto("/reconciliation/")
            _shoot(page, out, "reconciliation")
            page.locator("#queue-rows tr").first.get_by_role("link").first.click()
            _shoot(page, out, "operation")

            _sign_in(page, "operator")
            page.goto("/operations/")
            _shoot(page, out, "operations")
            page.goto("/runs/")
            _shoot(page, out, "runs")
            page.locator("#runs tbody tr", has_text=re.compile("user:cus_2024")).get_by_role(
                "link"
            ).first.click()
            _shoot(page, out, "run")
            page.goto("/tools/")
            _shoot(page, out, "tools")
            page.goto("/tools/send_refund/")
            _shoot(page, out, "tool")
            page.goto("/audit/")
            _shoot(page, out, "audit")
            page.goto("/dashboard/")
            _shoot(page, out, "dashboard")
            context.close()
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="effectgate-screenshots-") as var_dir:
        env = _environment(var_dir)
        print("Seeding a throw-away demo database…")
        _manage(env, "migrate", "--noinput")
        _manage(env, "seed_demo")
        port = _free_port()
        server = subprocess.Popen(  # noqa: S603 (our own manage.py)
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base_url = f"http://127.0.0.1:{port}"
            _wait_for(f"{base_url}/login/")
            print(f"Photographing {base_url} into {args.out}:")
            photograph(base_url, args.out)
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
