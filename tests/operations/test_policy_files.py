"""A Cedar file split into one policy per statement (operations/policies/files.py):
comments and annotations stay with their statement, a ';' inside a string or a comment
ends nothing, and a duplicate @id or a broken statement is refused by its line."""

import pytest

from operations.policies import files
from operations.policies.errors import PolicyInvalid

FILE = """// Payments team policies; reviewed weekly.

// Nobody refunds more than 5000.00; not even on Fridays.
@id("no-huge")
@message("Refunds; at most 5000.00")
forbid(principal, action == Action::"register", resource)
when { context.principal like "*;*" };  // a principal with ';' in it

@id("big-refunds") @approval("required")
permit(principal, action == Action::"register", resource); @id("plain")
permit(principal, action == Action::"register", resource);
"""


def test_each_statement_keeps_its_comments_annotations_and_strings():
    statements = files.split(FILE)
    assert [s.policy_id for s in statements] == ["no-huge", "big-refunds", "plain"]
    first = statements[0].text
    assert first.startswith("// Payments team policies; reviewed weekly.")
    assert "// Nobody refunds more than 5000.00; not even on Fridays." in first
    assert '@message("Refunds; at most 5000.00")' in first
    assert first.endswith("};  // a principal with ';' in it")
    assert statements[1].text == (
        '@id("big-refunds") @approval("required")\n'
        'permit(principal, action == Action::"register", resource);'
    )
    assert (
        statements[2].text
        == '@id("plain")\npermit(principal, action == Action::"register", resource);'
    )
    assert [s.line for s in statements] == [4, 9, 10]
    assert statements[1].policy.kind == "require"


def test_an_escaped_quote_does_not_end_a_string():
    text = '@id("q") forbid(principal, action, resource) when { context.principal == "a\\";b" };'
    (only,) = files.split(text)
    assert only.text == text


def test_a_duplicate_id_is_refused_with_both_lines():
    text = (
        '@id("a")\nforbid(principal, action, resource);\n\n'
        '@id("a")\npermit(principal, action, resource);\n'
    )
    with pytest.raises(PolicyInvalid, match=r'@id\("a"\) names two statements, at lines 1 and 4'):
        files.split(text)


def test_a_broken_statement_is_named_by_its_line_with_cedars_message():
    text = (
        '@id("ok")\nforbid(principal, action, resource);\n\n'
        '@id("bad")\nforbid(principal, action resource);\n'
    )
    with pytest.raises(PolicyInvalid, match="The statement at line 4: Cedar cannot parse"):
        files.split(text)


def test_a_missing_final_semicolon_an_empty_file_and_a_huge_file_are_refused():
    with pytest.raises(PolicyInvalid, match="does not end with ';'"):
        files.split(
            '@id("a") forbid(principal, action, resource);\n'
            '@id("b") forbid(principal, action, resource)'
        )
    with pytest.raises(PolicyInvalid, match="no policy statement"):
        files.split("// only a comment; nothing else\n\n")
    with pytest.raises(PolicyInvalid, match="at most"):
        files.split("//" + "x" * files.MAX_FILE)
    with pytest.raises(PolicyInvalid, match="at most 200 statements"):
        files.split(
            "".join(f'@id("p{i}") forbid(principal, action, resource);\n' for i in range(201))
        )


def test_an_unterminated_string_is_refused():
    with pytest.raises(PolicyInvalid, match="does not end with ';'"):
        files.split('@id("a") forbid(principal, action, resource) when { "x; };\n')


def test_a_statement_without_an_id_is_refused():
    with pytest.raises(PolicyInvalid, match="The statement at line 1: A policy needs an @id"):
        files.split("forbid(principal, action, resource);")
