"""A real OpenID provider on loopback for the single sign-on tests: oidc-provider from
npm (package.json), run with Node by tests/support/oidc_provider.mjs."""

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "oidc_provider.mjs"
CLIENT_ID = "effectgate-console"
CLIENT_SECRET = "a test client's secret, nothing else"


@dataclass
class Provider:
    issuer: str
    users_file: Path

    def people_set(self, people: dict[str, dict[str, Any]]) -> None:
        """Replace the provider's people ({sub: claims}); read at its next look-up."""
        self.users_file.write_text(json.dumps(people))

    def settings(self, **extra: Any) -> dict[str, Any]:
        """The console's settings for this provider (for ``override_settings``)."""
        return {
            "OIDC_ISSUER": self.issuer,
            "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_SCOPES": "openid email profile groups",
            "OIDC_PROVIDER_NAME": "Test IdP",
            **extra,
        }


@contextmanager
def oidc_provider(
    *, console_url: str, people: dict[str, dict[str, Any]], id_token_ttl_s: int = 60
) -> Iterator[Provider]:
    """Start the provider with one client whose redirect URI is ``console_url``'s
    callback; stops it on exit."""
    node = shutil.which("node")
    if node is None or not (ROOT / "node_modules" / "oidc-provider").is_dir():
        raise RuntimeError("Node and oidc-provider (npm ci) are needed for the sign-on tests.")
    with tempfile.TemporaryDirectory(prefix="eg-oidc-") as folder:
        users = Path(folder) / "people.json"
        users.write_text(json.dumps(people))
        config = Path(folder) / "config.json"
        config.write_text(
            json.dumps(
                {
                    "port": 0,
                    "users_file": str(users),
                    "id_token_ttl_s": id_token_ttl_s,
                    "client": {
                        "client_id": CLIENT_ID,
                        "client_secret": CLIENT_SECRET,
                        "redirect_uris": [f"{console_url}/oidc/callback/"],
                        "post_logout_redirect_uris": [f"{console_url}/login/"],
                    },
                }
            )
        )
        process = subprocess.Popen(
            [node, str(SCRIPT), str(config)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert process.stdout is not None
            issuer = ""
            for line in process.stdout:
                if line.startswith("listening "):
                    issuer = line.split(" ", 1)[1].strip()
                    break
            if not issuer:
                raise RuntimeError("The OpenID provider did not start.")
            yield Provider(issuer=issuer, users_file=users)
        finally:
            process.terminate()
            process.wait(timeout=10)
