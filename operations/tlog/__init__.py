"""The transparency log over the ledger: its Merkle tree (RFC 9162), its leaves, its
checkpoints (C2SP signed notes) and its key.

``merkle``, ``leaves`` and ``notes`` are pure (no Django): hashing, proofs and their
verification, the checkpoint's text and signature. ``keys`` reads the signing key and
the origin from settings. The sealer that grows the log is ``services.seal``; the reads
that serve roots and proofs, ``selectors.tlog``; ``audit verify`` recomputes it all
(``audit.tlog``).
"""
