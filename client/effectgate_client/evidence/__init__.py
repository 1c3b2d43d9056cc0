"""Evidence bundles verified offline: ``effectgate-verify BUNDLE --key PUBLIC_KEY_FILE``.

An evidence bundle (``effectgate audit export``, or the console's "Download evidence")
holds one operation's rows, every event of its stream with its inclusion proof in the
server's transparency log, and a checkpoint of that log signed with Ed25519.
``checks.verify_bundle`` checks it all with the log's public key alone (no network, no
server code: RFC 9162 in ``merkle``, C2SP signed notes in ``notes``), and
``story.story`` says in plain words what it proves. Needs the ``verify`` extra
(``pip install 'effectgate-client[verify]'``, for ``cryptography``).
"""

from .checks import BundleError, Failure, Report, load_bundle, verify_bundle

__all__ = ["BundleError", "Failure", "Report", "load_bundle", "verify_bundle"]
