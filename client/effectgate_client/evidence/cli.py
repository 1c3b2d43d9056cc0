"""``effectgate-verify BUNDLE --key PUBLIC_KEY_FILE [--checkpoint NOTE_FILE ...]``.

Exit 0 only when everything checks (and print what the bundle proves); 1 when the
bundle does not verify (each failure named, one a line); 2 when it cannot be read at
all (no such file, not a bundle, no key). Reads files only: no network.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

MAX_KEY_BYTES = 16 * 1024
MAX_NOTE_BYTES = 64 * 1024

EPILOG = """\
The key is the log's public key (PEM), as the server publishes it at
/.well-known/effectgate-audit-key. A checkpoint kept by a witness (the note of an
audit.checkpoint webhook) holds the bundle to the history the witness saw: the bundle's
checkpoint must extend it (export the bundle with --witness-size SIZE).
"""


def _read(path: str, *, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise SystemExit(_usage(f"{what} {path}: {exc.strerror}")) from None
    if len(data) > limit:
        raise SystemExit(_usage(f"{what} {path} is larger than {limit} bytes"))
    return data


def _usage(message: str) -> int:
    print(f"effectgate-verify: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="effectgate-verify",
        description="Verify an Effectgate evidence bundle offline and say what it proves.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("bundle", metavar="BUNDLE", help="the evidence bundle (JSON)")
    parser.add_argument(
        "--key", required=True, metavar="PUBLIC_KEY_FILE", help="the log's Ed25519 public key (PEM)"
    )
    parser.add_argument(
        "--origin",
        metavar="ORIGIN",
        help="the log's origin, which its key signs under (default: the bundle's)",
    )
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="NOTE_FILE",
        help="a checkpoint a witness kept (a signed note); repeat for several",
    )
    parser.add_argument("--quiet", action="store_true", help="print only failures")
    args = parser.parse_args(argv)
    try:
        from .checks import MAX_BUNDLE_BYTES, BundleError, load_bundle, verify_bundle
        from .notes import NoteError, load_public_key
        from .story import shown, story
    except ImportError as exc:  # cryptography, from the verify extra
        return _usage(f"{exc}; install it with: pip install 'effectgate-client[verify]'")
    try:
        key = load_public_key(_read(args.key, limit=MAX_KEY_BYTES, what="the key file"))
    except NoteError as exc:
        return _usage(f"{args.key}: {exc}")
    witnesses = []
    for path in args.checkpoint:
        data = _read(path, limit=MAX_NOTE_BYTES, what="the checkpoint")
        try:
            witnesses.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            return _usage(f"the checkpoint {path} is not UTF-8 text")
    try:
        bundle = load_bundle(_read(args.bundle, limit=MAX_BUNDLE_BYTES, what="the bundle"))
    except BundleError as exc:
        return _usage(f"{args.bundle}: {exc}")
    report = verify_bundle(bundle, key=key, origin=args.origin, witnesses=witnesses)
    if not report.ok:
        print(f"NOT VERIFIED: {Path(args.bundle).name} fails {len(report.failures)} checks.")
        for failure in report.failures:
            print(f"FAILED {shown(str(failure), limit=600)}")
        return 1
    if not args.quiet:
        sys.stdout.write(story(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
