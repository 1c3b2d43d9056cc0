"""The console's template helpers: reveal, badge, reltime, nav_link (no database)."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.template import Context, Template
from django.test import RequestFactory
from django.urls import resolve
from django.utils.safestring import mark_safe


def render(source: str, **context) -> str:
    return Template("{% load console_tags %}" + source).render(Context(context))


def marker(code: str, name: str) -> str:
    return f'<span class="visible-controls" title="U+{code} {name}">\u27e8U+{code}\u27e9</span>'


# ---- reveal ------------------------------------------------------------------------


def test_reveal_marks_a_right_to_left_override():
    assert render("{{ text|reveal }}", text="pay\u202eevil") == (
        "pay" + marker("202E", "RIGHT-TO-LEFT OVERRIDE") + "evil"
    )


def test_reveal_escapes_markup():
    out = render("{{ text|reveal }}", text='<script>alert("x")</script>&')
    assert out == "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;"


def test_reveal_escapes_text_that_is_already_marked_safe():
    # Runner text is never trusted, even if some code marked it safe by mistake.
    assert render("{{ text|reveal }}", text=mark_safe("<b>hi</b>")) == "&lt;b&gt;hi&lt;/b&gt;"


def test_reveal_escapes_with_autoescape_off():
    out = render("{% autoescape off %}{{ text|reveal }}{% endautoescape %}", text="<i>\u200b")
    assert out == "&lt;i&gt;" + marker("200B", "ZERO WIDTH SPACE")


def test_reveal_keeps_newlines_and_tabs_and_ordinary_text():
    text = "line one\n\tline two: café, 東京, שלום, emoji 🙂"
    assert render("{{ text|reveal }}", text=text) == text


@pytest.mark.parametrize(
    ("char", "name"),
    [
        ("\u200b", "ZERO WIDTH SPACE"),
        ("\u200c", "ZERO WIDTH NON-JOINER"),
        ("\u200d", "ZERO WIDTH JOINER"),
        ("\u200e", "LEFT-TO-RIGHT MARK"),
        ("\u200f", "RIGHT-TO-LEFT MARK"),
        ("\u202a", "LEFT-TO-RIGHT EMBEDDING"),
        ("\u202b", "RIGHT-TO-LEFT EMBEDDING"),
        ("\u202c", "POP DIRECTIONAL FORMATTING"),
        ("\u202d", "LEFT-TO-RIGHT OVERRIDE"),
        ("\u202e", "RIGHT-TO-LEFT OVERRIDE"),
        ("\u2060", "WORD JOINER"),
        ("\u2061", "FUNCTION APPLICATION"),
        ("\u2062", "INVISIBLE TIMES"),
        ("\u2063", "INVISIBLE SEPARATOR"),
        ("\u2064", "INVISIBLE PLUS"),
        ("\u2066", "LEFT-TO-RIGHT ISOLATE"),
        ("\u2067", "RIGHT-TO-LEFT ISOLATE"),
        ("\u2068", "FIRST STRONG ISOLATE"),
        ("\u2069", "POP DIRECTIONAL ISOLATE"),
        ("\ufeff", "ZERO WIDTH NO-BREAK SPACE"),
        ("\u00ad", "SOFT HYPHEN"),
        ("\u180e", "MONGOLIAN VOWEL SEPARATOR"),
        ("\u061c", "ARABIC LETTER MARK"),
        ("\U000e0041", "TAG LATIN CAPITAL LETTER A"),
        ("\r", "CARRIAGE RETURN"),
        ("\x00", "NULL"),
        ("\x1b", "ESCAPE"),
        ("\x7f", "DELETE"),
        ("\x85", "NEXT LINE"),
        ("\x01", "CONTROL CHARACTER"),
        ("\u2028", "LINE SEPARATOR"),
        ("\u2029", "PARAGRAPH SEPARATOR"),
        ("\u00a0", "NO-BREAK SPACE"),
        ("\u3164", "HANGUL FILLER"),
        ("\ufe0f", "VARIATION SELECTOR-16"),
        ("\ue000", "PRIVATE USE CHARACTER"),
    ],
)
def test_reveal_marks_each_invisible_character(char, name):
    code = f"{ord(char):04X}"
    assert render("{{ text|reveal }}", text=f"a{char}b") == f"a{marker(code, name)}b"


def test_reveal_marks_every_character_of_a_run():
    out = render("{{ text|reveal }}", text="\u2066\u2069")
    assert out == marker("2066", "LEFT-TO-RIGHT ISOLATE") + marker(
        "2069", "POP DIRECTIONAL ISOLATE"
    )


def test_reveal_handles_none_and_non_strings():
    assert render("{{ text|reveal }}", text=None) == ""
    assert render("{{ text|reveal }}", text=500) == "500"


# ---- badge --------------------------------------------------------------------------


def test_badge_renders_a_status():
    assert render("{{ s|badge }}", s="awaiting_approval") == (
        '<span class="badge badge-awaiting_approval">awaiting approval</span>'
    )


def test_badge_escapes_and_sanitises_the_class():
    out = render("{{ s|badge }}", s='x"><script>')
    assert out == '<span class="badge badge-x-script">x&quot;&gt;&lt;script&gt;</span>'


def test_badge_of_nothing_is_empty():
    assert render("{{ s|badge }}", s=None) == ""
    assert render("{{ s|badge }}", s="") == ""


# ---- reltime --------------------------------------------------------------------------


def test_reltime_renders_a_time_element_in_utc():
    moment = datetime(2025, 3, 4, 5, 6, 7, 890, tzinfo=timezone(timedelta(hours=2)))
    assert render("{{ t|reltime }}", t=moment) == (
        '<time datetime="2025-03-04T03:06:07Z" title="2025-03-04 03:06:07 UTC" '
        "data-relative>2025-03-04 03:06:07 UTC</time>"
    )


def test_reltime_treats_naive_datetimes_as_the_default_time_zone():
    out = render("{{ t|reltime }}", t=datetime(2025, 1, 1, 12, 0))  # TIME_ZONE = "UTC"
    assert out.startswith('<time datetime="2025-01-01T12:00:00Z"')


def test_reltime_of_nothing_falls_back_to_default():
    assert render('{{ t|reltime|default:"—" }}', t=None) == "—"


def test_reltime_of_a_non_datetime_is_escaped_text():
    assert render("{{ t|reltime }}", t="<soon>") == "&lt;soon&gt;"


# ---- nav_link ---------------------------------------------------------------------------


def _request(path: str):
    request = RequestFactory().get(path)
    request.resolver_match = resolve(path)
    return request


def test_nav_link_marks_the_current_page():
    out = render('{% nav_link "console:inbox" "Inbox" %}', request=_request("/"))
    assert out == '<li><a href="/" aria-current="page">Inbox</a></li>'


def test_nav_link_on_another_page_is_plain():
    out = render('{% nav_link "console:inbox" "Inbox" %}', request=_request("/api/docs/"))
    assert out == '<li><a href="/">Inbox</a></li>'


def test_nav_link_follows_nav_section():
    out = render(
        '{% nav_link "console:inbox" "Inbox" section="approvals" %}',
        request=_request("/api/docs/"),
        nav_section="approvals",
    )
    assert 'aria-current="page"' in out


def test_nav_link_to_a_url_name_that_does_not_exist_renders_nothing():
    assert render('{% nav_link "console:no-such-page" "Nope" %}') == ""


def test_reltime_uses_utc_constant():
    # Guard against a local time zone sneaking into the absolute text.
    out = render("{{ t|reltime }}", t=datetime(2025, 6, 1, 0, 0, tzinfo=UTC))
    assert 'title="2025-06-01 00:00:00 UTC"' in out
