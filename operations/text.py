"""Text a person reads and decides on: which characters hide, and principals as
identities. Pure: no Django, no database.

A character "hides" when it renders as nothing, as a plain space, or reorders what
is around it (bidirectional controls): the console shows each as a visible marker
(``console_tags.reveal``), and a principal, an identity people are barred by, may not
hold one at all.
"""

import unicodedata

# Characters that are kept as they are although their category is Cc.
_KEPT_CONTROLS = frozenset("\n\t")

# Unicode categories whose characters are shown as markers: format characters
# (zero-width, bidirectional controls, tags, soft hyphen...), controls, line and
# paragraph separators, private-use, surrogates and unassigned code points.
_MARKED_CATEGORIES = frozenset({"Cf", "Cc", "Zl", "Zp", "Co", "Cs", "Cn"})

# Characters outside those categories that render as nothing (or as a plain space) and
# so can hide a difference: fillers, invisible combining marks, variation selectors
# (used to smuggle data into text that looks unchanged) and every space but U+0020.
_MARKED_EXTRA = frozenset(
    [
        0x034F,  # COMBINING GRAPHEME JOINER
        0x115F,  # HANGUL CHOSEONG FILLER
        0x1160,  # HANGUL JUNGSEONG FILLER
        0x17B4,  # KHMER VOWEL INHERENT AQ
        0x17B5,  # KHMER VOWEL INHERENT AA
        0x2800,  # BRAILLE PATTERN BLANK
        0x3164,  # HANGUL FILLER
        0xFFA0,  # HALFWIDTH HANGUL FILLER
        *range(0x180B, 0x1810),  # MONGOLIAN FREE VARIATION SELECTORS, VOWEL SEPARATOR
        *range(0xFE00, 0xFE10),  # VARIATION SELECTOR-1..16
        *range(0xE0100, 0xE01F0),  # VARIATION SELECTOR-17..256
    ]
)


def is_hidden(char: str) -> bool:
    """Whether ``char`` renders invisibly, as a plain space, or as a control."""
    if char in _KEPT_CONTROLS:
        return False
    code = ord(char)
    if code in _MARKED_EXTRA:
        return True
    category = unicodedata.category(char)
    if category == "Zs":
        return code != 0x20
    return category in _MARKED_CATEGORIES


def hidden_characters(text: str) -> list[str]:
    """The hiding characters of ``text``, as ``U+XXXX`` strings, in order."""
    return [f"U+{ord(char):04X}" for char in text if char in "\n\t" or is_hidden(char)]


# The column that stores a principal (operations.Run.principal, Operation.principal).
PRINCIPAL_MAX_LENGTH = 255


def normalize_principal(principal: str) -> str:
    """A principal as an identity: NFKC, then case-folded (``user:ALICE`` and
    ``user:alice`` name one person). Raise ``ValueError`` naming the characters when
    it holds one that hides (zero-width, bidirectional control, a space other than
    U+0020, a tab or a line break...) or is empty once trimmed of spaces."""
    hidden = hidden_characters(principal)
    if hidden:
        raise ValueError(f"the principal holds characters that hide: {', '.join(hidden)}")
    normalized = unicodedata.normalize("NFKC", principal).casefold()
    hidden = hidden_characters(normalized)
    if hidden:
        raise ValueError(f"the principal holds characters that hide: {', '.join(hidden)}")
    if not normalized.strip():
        raise ValueError("the principal is empty")
    if len(normalized) > PRINCIPAL_MAX_LENGTH:
        # NFKC can lengthen text (U+FDFA becomes 18 letters).
        raise ValueError(
            f"normalized, the principal is {len(normalized)} characters long; "
            f"at most {PRINCIPAL_MAX_LENGTH} are kept"
        )
    return normalized
